"""Router plugins: one file each, chosen with `router=NAME` (configs/router/NAME.yaml)."""
