"""Run settings refused before anything runs, by arithmetic, each message naming its key.

Values the typed fields accept can still make a run end late and badly: an objective no summary
has (found after the whole replay), a hardware spec so slow the step time overflows, a KV cache
whose bookkeeping alone exceeds the machine's memory. Each is worked out here from the config.
"""
from __future__ import annotations

import math

from policylab.traces.replicate import physical_memory

MAX_PREDICTOR_NOISE = 10.0       # lognormal sigma: e^(10·4) = 2e17x at four sigmas, past any length
MAX_STEP_SECONDS = 1e6           # the largest schedulable step beyond this (11 days): a unit slip
KV_BYTES_PER_BLOCK = 48          # the KV accounting's Python lists and deque, per block

STATS = {"mean", "p50", "p90", "p95", "p99", "p99.9", "max"}
# summary key roots and the numeric leaves under them ("" for a number at the root; None: any,
# the figures that depend on the run's shape, as a cluster's replicas)
OBJECTIVES = {
    "counts": {"requests", "finished", "rejected", "unfinished"},
    **{k: {""} for k in ("trace_duration", "makespan", "slo_attainment", "goodput", "preemptions",
                         "prefix_cache_hit_rate")},
    **{k: STATS for k in ("ttft", "tpot", "e2e", "normalized_latency", "queueing_delay", "itl")},
    "slo": {"ttft", "tpot"},
    "throughput": {"input_tokens_per_s", "output_tokens_per_s", "requests_per_s"},
    "kv_utilization": {"max", "mean"},
    "fairness": None, "fairness_windows": None, "kv_hierarchy": None, "programs": None, "cluster": None,
    "trace_report": None, "cost_model": None, "speculative": None,
}


def check_objective(objective: str) -> None:
    """`objective` names a numeric summary key (`goodput`, `ttft.p99`, `throughput/output_tokens_per_s`)."""
    name = str(objective).replace("/", ".")
    root, _, leaf = name.partition(".")
    leaves = OBJECTIVES.get(root, set())
    if root not in OBJECTIVES or (leaves is not None and leaf not in leaves) or (leaves is None and not leaf):
        known = [r if leaves == {""} else f"{r}.{'|'.join(sorted(leaves)) if leaves else '...'}"
                 for r, leaves in OBJECTIVES.items()]
        raise ValueError(f"objective={objective}: not a numeric summary key; one of {', '.join(known)}")


def check_values(run) -> None:
    """The run's values that pass their fields' types but cannot work (ValueError naming the key)."""
    if not isinstance(run.seed, int) or run.seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {run.seed!r}")
    e = run.engine
    if e.block_size > e.max_model_len:
        raise ValueError(f"engine.block_size={e.block_size} exceeds engine.max_model_len={e.max_model_len}: "
                         f"a KV block holds tokens of one request")
    if e.predictor_noise > MAX_PREDICTOR_NOISE:
        raise ValueError(f"engine.predictor_noise must be <= {MAX_PREDICTOR_NOISE} (lognormal sigma; e^sigma "
                         f"is the typical error factor), got {e.predictor_noise}")
    memory = physical_memory()
    if e.num_blocks is not None and memory and e.num_blocks * KV_BYTES_PER_BLOCK > memory:
        raise ValueError(f"engine.num_blocks={e.num_blocks:,}: its accounting alone needs "
                         f"{e.num_blocks * KV_BYTES_PER_BLOCK / 2**30:,.0f} GiB, this machine has "
                         f"{memory / 2**30:,.0f} GiB")
    check_objective(run.objective)
    if run.dataplane.kind == "sim" and not run.dataplane.calibration and not run.dataplane.profile:
        check_largest_step(run)


def check_largest_step(run) -> None:
    """The roofline's time for the largest steps the engine budgets allow (a full prefill chunk,
    and every sequence decoding at the full context) is finite and plausible: a bandwidth of
    1e-300 B/s overflowed mid-run."""
    from policylab.dataplane.roofline import Roofline
    e, hw = run.engine, run.hardware
    budget, seqs, ctx = e.max_num_batched_tokens, e.max_num_seqs, e.max_model_len
    try:
        model = Roofline(run.model, hw)
        times = [model.step_time([budget], [max(ctx - budget, 0)], budget, 1),
                 model.step_time([1] * seqs, [ctx - 1] * seqs, seqs, seqs)]
    except (OverflowError, ZeroDivisionError, ValueError):
        times = [math.inf]
    worst = max(times)
    if not worst < MAX_STEP_SECONDS:
        raise ValueError(f"hardware: the largest step the engine may schedule ({budget} tokens, context "
                         f"{ctx}) would take {worst:.3g} s with hardware.peak_flops={hw.peak_flops:g}, "
                         f"hardware.mem_bandwidth={hw.mem_bandwidth:g}, hardware.kernel_latency="
                         f"{hw.kernel_latency:g}, hardware.step_overhead={hw.step_overhead:g} "
                         f"(FLOP/s, bytes/s, seconds)")
