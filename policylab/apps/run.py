"""The `python -m policylab run` job: replay a trace, then write files, log and print the summary."""
from __future__ import annotations

import gc
import sys
from pathlib import Path

from omegaconf import DictConfig

from policylab.apps.config import RunConfig, plot_settings, typed_config
from policylab.apps.jobs import (TRACEBACK_FILE, build_engine, in_parallel_launcher, replay, run_name,  # noqa: F401
                                 sweep_group, write_traceback)
from policylab.apps.offered_load import resolve_load
from policylab.apps.run_report import draw_plots, report
from policylab.apps.signals import ReplaySignals, signal_name
from policylab.traces import load_trace



# The engine and its extensions hold one another (bound hooks, the operations facade), so a
# replay's objects are freed by a full collection, not when the job drops them. A replay this
# large gets one before the plots and W&B; a smaller one holds a few MB, less than a full
# collection is worth in a process that runs many jobs (a sweep, the tests).
COLLECT_AFTER_REQUESTS = 10_000


def run(cfg: RunConfig | DictConfig, run_dir: Path, verbose: bool = True) -> dict:
    """Replay and write the results; a stop signal (SIGINT/SIGTERM/SIGHUP) ends the replay, the
    results are still written (marked partial), then the job exits with 128 + the signal number.
    The handlers stay until the job ends: a signal while plots draw or W&B logs ends those, says
    that the results are complete, and finishes the W&B run with the signal's exit code.
    `verbose=False` (the Python API's default): a progress bar that goes away when the replay
    ends, and no summary; warnings are still printed."""
    cfg, load = resolve_load(typed_config(cfg), verbose)
    if cfg.dataplane.kind == "vllm":
        from policylab.apps.run_vllm import run_vllm
        return run_vllm(cfg, run_dir)
    from policylab.analysis.result_stream import ResultStream
    from policylab.analysis.tracking import open_tracker
    from policylab.apps.settings import result_settings, tracker_settings

    with ReplaySignals() as signals:
        trace = load_trace(cfg.trace, seed=cfg.seed)
        engine = build_engine(cfg, trace=trace)
        loaded = measured_on_loaded_cpu(cost_model_of(engine))
        tracker = open_tracker(tracker_settings(cfg), run_dir, sweep_group(), run_name(run_dir))
        results = ResultStream(run_dir, engine.trace, result_settings(cfg), signals.held)   # written as the run goes
        extra = {"trace_report": trace.report.as_dict(), **({"load": load} if load else {})}
        if not hasattr(engine, "replicas"):      # (a cluster's replicas: not rebuilt from a handler)
            signals.stuck_writer = lambda why: write_stuck_replay(engine, results, extra, tracker, signals,
                                                                  run_dir, why)
        progress = cfg.progress and ("lines" if in_parallel_launcher() else True if verbose else "transient")
        result = replay(engine, progress, signals, results.attach(engine), label=run_dir.name)
        if result.traceback:
            result.error += f" (traceback: {write_traceback(run_dir, result.traceback)})"
        cost_model = cost_model_of(engine)                                  # what timed the steps
        loaded = loaded or measured_on_loaded_cpu(cost_model, finished=True)
        extra.update({"cost_model": cost_model} if cost_model else {})
        extra.update(plane_reports(engine, "quality_report", merge=None, key="quality"))
        summary = results.finish(result, extra, plane_reports(engine, "energy_report").get("energy"))
        partial, error = result.partial, result.error
        signals.stuck_writer = None
        large = len(engine.trace) >= COLLECT_AFTER_REQUESTS
        del engine, trace, result, results      # (a million requests: gigabytes the plots can use,
        if large:                               # once a full collection frees the replay's cycles)
            gc.collect()
        if signals.stopped_by:
            tracker.finish(signals.exit_code())
            print(f"run stopped by a signal: {error} — partial results written to {run_dir}", file=sys.stderr)
            raise SystemExit(signals.exit_code())
        signals.rearm()
        phase, plots = "drawing the plots", plot_settings(cfg.plots)
        try:
            if plots.enabled:
                draw_plots(run_dir, plots)
            phase = "logging to W&B"
            tracker.log_run(run_dir, summary)
        except KeyboardInterrupt:
            pass                               # (signals.stopped_by says which)
        signals.shield()
        if signals.stopped_by:
            tracker.finish(signals.exit_code())
            print(f"stopped by {signal_name(signals.stopped_by)} while {phase}: the results in {run_dir} are "
                  f"complete (summary.json, requests.parquet, steps.parquet)"
                  + (", the plots may not all be there" if plots.enabled else ""), file=sys.stderr)
            raise SystemExit(signals.exit_code())
        tracker.finish()
        report(cfg, summary, run_dir, partial, error, loaded, cost_model, verbose)
        if signals.stopped_by:         # (while the W&B run finished: everything is written)
            print(f"{signal_name(signals.stopped_by)} received after the results were written", file=sys.stderr)
            raise SystemExit(signals.exit_code())
    return summary


def write_stuck_replay(engine, results, extra: dict, tracker, signals, run_dir: Path, why: str) -> None:
    """The replay did not return after a stop signal (a policy that swallows exceptions): the
    results as they are, from the signal handler, before the process ends."""
    from policylab.apps.jobs import salvage
    name = signal_name(signals.stopped_by)
    result = salvage(engine, KeyboardInterrupt(name))
    result.error = f"interrupted ({name}); the replay did not stop, results written at {why}"
    try:
        results.finish(result, {**extra, **({"cost_model": cost_model_of(engine)} if cost_model_of(engine) else {})})
        print(f"run stopped by {name}: the policy did not return from schedule(); partial results written to "
              f"{run_dir} ({why})", file=sys.stderr)
    except Exception as e:          # (the process ends either way: say what is missing)
        print(f"run stopped by {name}: the policy did not return, and the results could not all be "
              f"written: {e}", file=sys.stderr)
    tracker.finish(signals.exit_code())


def cost_model_of(engine) -> dict | None:
    """The cost model that timed a replay's steps; a cluster's when its replicas share one."""
    planes = [r.engine.dataplane for r in engine.replicas] if hasattr(engine, "replicas") else [engine.dataplane]
    described = [p.describe_cost_model() for p in planes if hasattr(p, "describe_cost_model")]
    if not described:
        return None
    return described[0] if all(d == described[0] for d in described) else {"kind": "mixed", "replicas": described}


def plane_reports(engine, method: str, merge="energy", key: str = "energy") -> dict:
    """{key: report} of the planes' `method()` (energy: merged over a cluster's replicas;
    quality: one plane's), or {} when no plane reports one."""
    planes = [r.engine.dataplane for r in engine.replicas] if hasattr(engine, "replicas") else [engine.dataplane]
    reports = [getattr(p, method)() for p in planes if hasattr(p, method)]
    reports = [r for r in reports if r]
    if not reports:
        return {}
    if merge == "energy":
        from policylab.dataplane.energy import merge_reports
        return {key: merge_reports(reports)}
    return {key: reports[0]}


def measured_on_loaded_cpu(cost_model: dict | None, finished: bool = False) -> str | None:
    """The loaded-machine warning for a replay timed by measured CPU steps (None for any other
    timing). After the replay the load average counts its own threads, so they are taken off."""
    if not cost_model or cost_model.get("kind") != "real" or cost_model.get("device") != "cpu":
        return None
    import os
    from policylab.dataplane.cpu_host import loaded_machine
    threads = cost_model.get("threads") or 1
    try:
        load = os.getloadavg()[0] - (threads if finished else 0)
    except (AttributeError, OSError):
        return None
    return loaded_machine(threads, load=max(load, 0.0))


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
