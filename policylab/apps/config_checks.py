"""Run settings refused before anything runs, by arithmetic, each message naming its key.

Values the typed fields accept can still make a run end late and badly: an objective no summary
has (found after the whole replay), a hardware spec so slow the step time overflows, a KV cache
whose bookkeeping alone exceeds the machine's memory, a time no clock can hold exactly, a link no
real one is like. Each is worked out here from the config: the sizes (`memory_needs`, against
the machine's memory), every time field (`TIME_FIELDS`, within the limit arrivals have), every link
bandwidth (`LINK_FIELDS`, within what real links do) and, once the trace and the data plane are
known, the sequences the trace asks for (`check_workload`) and a cluster's replicas (`check_replicas`).
"""
from __future__ import annotations

import math

from policylab.core.request import MAX_ARRIVAL_S
from policylab.traces.fields import MAX_SAMPLES
from policylab.traces.replicate import physical_memory

MAX_PREDICTOR_NOISE = 10.0       # lognormal sigma: e^(10·4) = 2e17x at four sigmas, past any length
MAX_STEP_SECONDS = 1e6           # the largest schedulable step beyond this (11 days): a unit slip
KV_BYTES_PER_BLOCK = 64          # the KV accounting's Python lists and deque, per block (62 measured)
TIER_BYTES_PER_BLOCK = 64        # a host or disk tier's free list and LRU entry, per block
ENGINE_BYTES = 24_000            # one replica's engine, policy and plane besides its blocks (21 KB measured)
SEQUENCE_BYTES = 600             # one sample or beam of a request: its request state (320 B measured) ...
TOKEN_BYTES = 32                 # ... and per output token it keeps (ids and times; 23 B measured)
LINK_BANDWIDTH = (1e6, 1e13)     # bytes/s: 1 MB/s (a slow WAN) to 10 TB/s (past NVLink 5's 1.8 TB/s)
TIME_FIELDS = ("engine.swap_latency", "cluster.link.latency", "hardware.kernel_latency", "hardware.step_overhead",
               "hardware.host_per_request", "hardware.host_per_token", "hardware.link_latency",
               "hardware.collective_latency", "hardware.attention_floor", "hardware.decode_attention_floor",
               "hardware.elementwise_latency", "slo.ttft", "slo.tpot", "fairness.window", "trace.start_time",
               "trace.end_time", "capacity.min_replay_s")
LINK_FIELDS = ("engine.swap_bandwidth", "cluster.link.bandwidth", "hardware.link_bandwidth")

STATS = {"mean", "p50", "p90", "p95", "p99", "p99.9", "max"}
# summary key roots and the numeric leaves under them ("" for a number at the root; None: any,
# the figures that depend on the run's shape, as a cluster's replicas)
OBJECTIVES = {
    "counts": {"requests", "finished", "rejected", "unfinished"},
    **{k: {""} for k in ("trace_duration", "makespan", "slo_attainment", "goodput", "preemptions",
                         "prefix_cache_hit_rate")},
    **{k: STATS for k in ("ttft", "tpot", "e2e", "normalized_latency", "queueing_delay", "itl")},
    "slo": {"ttft", "tpot"},
    "qoe": STATS, "qoe_expected": {"ttft", "tds"},
    "throughput": {"input_tokens_per_s", "output_tokens_per_s", "requests_per_s"},
    "kv_utilization": {"max", "mean"},
    "fairness": None, "fairness_windows": None, "kv_hierarchy": None, "programs": None, "cluster": None,
    "trace_report": None, "cost_model": None, "speculative": None, "energy": None, "quality": None,
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
    check_times(run)
    check_links(run)
    if e.parallel_samples > MAX_SAMPLES or e.beam_width > MAX_SAMPLES:
        key = "parallel_samples" if e.parallel_samples > MAX_SAMPLES else "beam_width"
        raise ValueError(f"engine.{key}={getattr(e, key):,}: at most {MAX_SAMPLES:,} samples or beams per request")
    if e.beam_width > e.max_num_seqs:
        raise ValueError(f"engine.beam_width={e.beam_width:,} exceeds engine.max_num_seqs={e.max_num_seqs}: a "
                         f"request's beams decode together, each a running sequence")
    check_memory(memory_needs(run))
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


def _value(run, key: str):
    node = run
    for part in key.split("."):
        node = getattr(node, part)
    return node


def check_times(run) -> None:
    """Every time field within [0, MAX_ARRIVAL_S] s: past it float64 seconds lose the precision
    latencies need, as arrivals do (DESIGN §5)."""
    for key in TIME_FIELDS:
        value = _value(run, key)
        if value is not None and not 0 <= value <= MAX_ARRIVAL_S:
            raise ValueError(f"{key}={value:g}: a time in seconds must be finite, >= 0 and at most "
                             f"{MAX_ARRIVAL_S:g} s (as an arrival)")


def check_links(run) -> None:
    """Link bandwidths within what real links do (`LINK_BANDWIDTH`): 1e-3 B/s is a unit slip that
    turns one block copy into years of virtual time."""
    low, high = LINK_BANDWIDTH
    for key in LINK_FIELDS:
        value = _value(run, key)
        if key == "cluster.link.bandwidth" and run.cluster.link.kind != "bandwidth":
            continue
        if value is not None and not low <= value <= high:
            raise ValueError(f"{key}={value:g} bytes/s: no real link has it; a link moves {low:.0e} (1 MB/s) to "
                             f"{high:.0e} (10 TB/s) bytes/s")


def memory_needs(run, blocks_per_replica: int | None = None) -> list:
    """(config key as the message shows it, bytes) of what the run holds in memory by its sizes
    alone: the KV accounting of every replica, the host and disk tiers' bookkeeping."""
    e, replicas = run.engine, run.cluster.size
    blocks = e.num_blocks if e.num_blocks is not None else blocks_per_replica
    needs = []
    if blocks is not None:
        where = f" x {replicas:,} replicas (cluster.replicas)" if replicas > 1 else ""
        needs.append((f"engine.num_blocks={blocks:,}{where}" if e.num_blocks is not None else
                      f"cluster.replicas={replicas:,} of {blocks:,} KV blocks each",
                      replicas * (blocks * KV_BYTES_PER_BLOCK + ENGINE_BYTES)))
    elif replicas > 1:
        needs.append((f"cluster.replicas={replicas:,}", replicas * ENGINE_BYTES))
    for key in ("host_kv_blocks", "prefix_host_blocks", "prefix_disk_blocks"):
        if getattr(e, key):
            needs.append((f"engine.{key}={getattr(e, key):,}", replicas * getattr(e, key) * TIER_BYTES_PER_BLOCK))
    return needs


def check_memory(needs: list) -> None:
    """Refuse sizes whose memory alone exceeds the machine's: the largest one by its key."""
    memory = physical_memory()
    if not memory or not needs or sum(n for _, n in needs) <= memory:
        return
    key, need = max(needs, key=lambda n: n[1])
    others = sum(n for _, n in needs) - need
    raise ValueError(f"{key}: its accounting alone needs {need / 2**30:,.1f} GiB"
                     + (f" (with the rest, {(need + others) / 2**30:,.1f} GiB)" if others else "")
                     + f", this machine has {memory / 2**30:,.0f} GiB")


def check_replicas(run, blocks_of) -> None:
    """A cluster's memory once a replica's data plane says how many KV blocks it holds
    (`blocks_of()`, the most of any replica's hardware; None: not known before the planes are
    built), before the replicas are built."""
    if run.cluster.size > 1 and run.engine.num_blocks is None and blocks_of is not None:
        check_memory(memory_needs(run, blocks_of()))


def check_workload(run, trace) -> None:
    """The sequences the trace asks for: samples and beams per request within MAX_SAMPLES, a
    request's beams within engine.max_num_seqs (they decode together), and all of them together
    within the machine's memory (each sample keeps its tokens until the results are written)."""
    from policylab.core.extensions.beams import beam_width_of
    from policylab.core.extensions.forks import samples_of, uses_forks
    e = run.engine
    if not uses_forks(trace, e.parallel_samples, e.beam_width):
        return
    sequences = held = 0
    for i, t in enumerate(trace):
        width = beam_width_of(t, e.beam_width)
        if width > e.max_num_seqs:
            raise ValueError(f"trace: request {i} (arrival {t.arrival_time:g} s) has beam_width={width:,}, beyond "
                             f"engine.max_num_seqs={e.max_num_seqs}: a request's beams decode together")
        n = width if width > 1 else samples_of(t, e.parallel_samples)
        sequences += n
        held += n * (SEQUENCE_BYTES + TOKEN_BYTES * t.output_tokens)
    key = "engine.parallel_samples" if e.parallel_samples else "engine.beam_width" if e.beam_width else \
        "the trace's n and beam_width"
    check_memory([(f"{key}: {sequences:,} sequences of {len(trace):,} requests", held)])
