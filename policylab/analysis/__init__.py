"""Analysis over run results: metrics, client fairness, result files, plots, comparison, W&B."""
