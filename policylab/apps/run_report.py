"""How every run ends on the terminal and in its directory once its results are written: the
plots (a figure that cannot be written is a warning, never a failed run) and the printout. Shared
by the replay on policylab's engine (run.py) and on vLLM's (run_vllm.py)."""
from __future__ import annotations

import sys
from pathlib import Path

from policylab.apps.jobs import in_parallel_launcher


def draw_plots(run_dir: Path, settings) -> None:
    from policylab.analysis.plots import write_run_plots
    try:
        write_run_plots(run_dir, settings)
    except OSError as e:         # the results are written: a missing figure is no failed run
        print(f"warning: plots not all written ({getattr(e, 'strerror', None) or e}); the results "
              f"in {run_dir} are complete", file=sys.stderr)


def report(cfg, summary: dict, run_dir: Path, partial: bool, error: str, loaded: str, cost_model: dict,
           verbose: bool = True) -> None:
    """What the terminal shows at the end of a run: the summary table (one line in a parallel
    sweep), a light-load or loaded-machine warning, what timed the steps, where the results are.
    Not verbose (the Python API): the warnings and a partial run's error only."""
    from policylab.analysis.compare_findings import light_load, slo_hint
    from policylab.analysis.results import print_summary
    if not verbose:
        pass
    elif in_parallel_launcher():     # jobs side by side: one line each, never interleaved tables
        attainment, goodput = summary["slo_attainment"], summary["goodput"]
        print(f"{run_dir.name}: SLO attainment {'—' if attainment is None else f'{attainment:.1%}'}, goodput "
              f"{'—' if goodput is None else f'{goodput:.3f}'} req/s (table: python -m policylab compare {run_dir})")
    else:
        print_summary(summary)
    light = light_load((summary["kv_utilization"]["max"] or 0) * 100, summary["queueing_delay"]["p99"],
                       cfg.slo.ttft)            # per-request SLOs may be tighter: the global one is the bar
    if light:
        print(f"warning: {light}", file=sys.stderr)
    attainment = summary.get("slo_attainment")
    hint = None if attainment is None or partial else \
        slo_hint([100 * attainment], (summary.get("load") or {}).get("fraction"), subject="this run")
    if hint and verbose:
        print(f"note: {hint}", file=sys.stderr)
    if loaded:
        print(f"warning: {loaded}", file=sys.stderr)
    if verbose and cost_model and cost_model.get("tokens_from") and not in_parallel_launcher():
        source = f"hardware '{cost_model['hardware']}'" if cost_model.get("hardware") else cost_model.get("kind", "?")
        print(f"step times: the cost model of {source} (the tokens are the real model's; "
              "dataplane.step_time=measured times the steps themselves)")
    if verbose:
        print(f"results: {run_dir}")
    if partial:
        print(f"run ended early: {error} — partial results written to {run_dir}", file=sys.stderr)
