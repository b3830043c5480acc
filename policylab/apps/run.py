"""The `python -m policylab run` job: replay a trace, then write files, log and print the summary."""
from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from policylab.apps.config import RunConfig, typed_config
from policylab.apps.jobs import build_engine, replay, sweep_group


def run(cfg: RunConfig | DictConfig, run_dir: Path) -> dict:
    cfg = typed_config(cfg)
    from policylab.analysis.results import print_summary, write_results
    from policylab.analysis.tracking import open_tracker

    engine = build_engine(cfg)
    tracker = open_tracker(cfg, run_dir, sweep_group())
    result = replay(engine, cfg.progress)
    summary = write_results(run_dir, result, cfg)
    if cfg.plots:
        from policylab.analysis.plots import write_run_plots
        write_run_plots(run_dir)
    tracker.log_run(run_dir, summary)
    tracker.finish()
    print_summary(summary)
    print(f"results: {run_dir}")
    if result.partial:
        print(f"run ended early: {result.error} — partial results written to {run_dir}", file=sys.stderr)
    return summary
