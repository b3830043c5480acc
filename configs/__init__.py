"""The Hydra configs, shipped inside the package as `policylab.configs` (see pyproject.toml)."""
