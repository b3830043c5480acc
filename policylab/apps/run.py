"""The `python -m policylab run` job: replay a trace, then write files, log and print the summary."""
from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from policylab.apps.config import RunConfig, typed_config
from policylab.apps.jobs import build_engine, in_parallel_launcher, replay, run_name, sweep_group
from policylab.apps.signals import ReplaySignals
from policylab.traces import load_trace

TRACEBACK_FILE = "traceback.txt"


def run(cfg: RunConfig | DictConfig, run_dir: Path) -> dict:
    """Replay and write the results; a stop signal (SIGINT/SIGTERM/SIGHUP) ends the replay, the
    results are still written (marked partial), then the job exits with 128 + the signal number."""
    cfg = typed_config(cfg)
    if cfg.dataplane.kind == "vllm":
        from policylab.apps.run_vllm import run_vllm
        return run_vllm(cfg, run_dir)
    from policylab.analysis.compare_stats import light_load
    from policylab.analysis.result_stream import ResultStream
    from policylab.analysis.results import print_summary
    from policylab.analysis.tracking import open_tracker

    with ReplaySignals() as signals:
        trace = load_trace(cfg.trace, seed=cfg.seed)
        engine = build_engine(cfg, trace=trace)
        tracker = open_tracker(cfg, run_dir, sweep_group(), run_name(run_dir))
        results = ResultStream(run_dir, engine.trace, cfg, signals.held)   # written as the run goes
        result = replay(engine, cfg.progress, signals, results.attach(engine))
        if result.traceback:
            result.error += f" (traceback: {write_traceback(run_dir, result.traceback)})"
        cost_model = cost_model_of(engine)                                  # what timed the steps
        extra = {"trace_report": trace.report.as_dict(), **({"cost_model": cost_model} if cost_model else {})}
        summary = results.finish(result, extra)
        partial, error = result.partial, result.error
        del engine, trace, result, results      # (a million requests: gigabytes the plots can use)
    if signals.stopped_by:
        tracker.finish()
        print(f"run stopped by a signal: {error} — partial results written to {run_dir}", file=sys.stderr)
        raise SystemExit(signals.exit_code())
    if cfg.plots:
        from policylab.analysis.plots import write_run_plots
        write_run_plots(run_dir)
    tracker.log_run(run_dir, summary)
    tracker.finish()
    if in_parallel_launcher():     # jobs side by side: one line each, never interleaved tables
        attainment, goodput = summary["slo_attainment"], summary["goodput"]
        print(f"{run_dir.name}: SLO attainment {'—' if attainment is None else f'{attainment:.1%}'}, goodput "
              f"{'—' if goodput is None else f'{goodput:.3f}'} req/s (table: python -m policylab compare {run_dir})")
    else:
        print_summary(summary)
    light = light_load((summary["kv_utilization"]["max"] or 0) * 100, summary["queueing_delay"]["p99"],
                       cfg.slo.ttft)            # per-request SLOs may be tighter: the global one is the bar
    if light:
        print(f"warning: {light}", file=sys.stderr)
    print(f"results: {run_dir}")
    if partial:
        print(f"run ended early: {error} — partial results written to {run_dir}", file=sys.stderr)
    return summary


def cost_model_of(engine) -> dict | None:
    """The cost model that timed a replay's steps; a cluster's when its replicas share one."""
    planes = [r.engine.dataplane for r in engine.replicas] if hasattr(engine, "replicas") else [engine.dataplane]
    described = [p.describe_cost_model() for p in planes if hasattr(p, "describe_cost_model")]
    if not described:
        return None
    return described[0] if all(d == described[0] for d in described) else {"kind": "mixed", "replicas": described}


def write_traceback(run_dir: Path, text: str) -> Path:
    """The exception's traceback in the run directory (the summary carries only its last line)."""
    path = Path(run_dir) / TRACEBACK_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:
        print(f"could not write {path}: {e}\n{text}", file=sys.stderr)
    return path


def objective_value(summary: dict, key: str) -> float:
    """The summary value `key` names (`goodput`, `ttft.p99`, `throughput/output_tokens_per_s`):
    what `run` returns to a Hydra sweeper. An unknown key fails with the keys there are."""
    from policylab.analysis.metrics import flatten
    from policylab.apps.jobs import fail
    values = {k.replace("/", "."): v for k, v in flatten({k: v for k, v in summary.items() if k != "config"}).items()}
    name = str(key).replace("/", ".")
    numeric = [k for k, v in values.items() if v is None or isinstance(v, (int, float)) and not isinstance(v, bool)]
    if name not in numeric:
        fail(f"objective={key}: not a numeric summary key; one of {', '.join(numeric[:40])}, ...")
    return float("nan") if values[name] is None else float(values[name])
