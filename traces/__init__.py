"""The project's generated traces, shipped inside the package as `policylab.shipped_traces`."""
