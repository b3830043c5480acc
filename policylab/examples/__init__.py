"""Example policies of the documentation, outside `policies/` so the shipped-policy tests never
pick them up. Installed with the package: `from policylab.examples.short_first import ShortFirst`,
and their configs with `hydra.searchpath=[pkg://policylab.examples]` (`policy=short_first`)."""
