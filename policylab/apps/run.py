"""The `python -m policylab run` job: replay a trace, then write files, log and print the summary."""
from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from policylab.apps.config import RunConfig, typed_config
from policylab.apps.jobs import build_engine, replay, sweep_group
from policylab.apps.signals import ReplaySignals
from policylab.traces import load_trace

TRACEBACK_FILE = "traceback.txt"


def run(cfg: RunConfig | DictConfig, run_dir: Path) -> dict:
    """Replay and write the results; a stop signal (SIGINT/SIGTERM/SIGHUP) ends the replay, the
    results are still written (marked partial), then the job exits with 128 + the signal number."""
    cfg = typed_config(cfg)
    from policylab.analysis.results import print_summary, write_results
    from policylab.analysis.tracking import open_tracker

    with ReplaySignals() as signals:
        trace = load_trace(cfg.trace, seed=cfg.seed)
        engine = build_engine(cfg, trace=trace)
        tracker = open_tracker(cfg, run_dir, sweep_group())
        result = replay(engine, cfg.progress, signals)
        if result.traceback:
            result.error += f" (traceback: {write_traceback(run_dir, result.traceback)})"
        summary = write_results(run_dir, result, cfg, {"trace_report": trace.report.as_dict()})
    if signals.stopped_by:
        tracker.finish()
        print(f"run stopped by a signal: {result.error} — partial results written to {run_dir}", file=sys.stderr)
        raise SystemExit(signals.exit_code())
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


def write_traceback(run_dir: Path, text: str) -> Path:
    """The exception's traceback in the run directory (the summary carries only its last line)."""
    path = Path(run_dir) / TRACEBACK_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:
        print(f"could not write {path}: {e}\n{text}", file=sys.stderr)
    return path
