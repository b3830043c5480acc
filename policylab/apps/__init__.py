"""Apps: the command line and its Hydra jobs. The only layer that imports Hydra."""
