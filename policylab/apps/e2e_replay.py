"""A benchmark's workload replayed on the sim, stage by stage: what `fidelity-e2e` compares.

A `Benchmark` is what a load generator's result files say (policylab.traces.loadgen reads them):
the server (model, GPU, TP and vLLM's knobs), the requests as a trace with the stage each belongs
to, and per stage the measured TTFT, end-to-end latency and per-token interval of the requests
that succeeded. `replay_benchmark` composes the run config a user would (`dataplane=sim
policy=vllm_v1`, the model, `hardware`, `dataplane.tensor_parallel`, `serving_engine`, `engine.*`
as vLLM's knobs say), replays the whole trace once (stages in order, so the prefix cache carries
over as on the server) and measures each stage as the load generator does. Where closed-loop users
sent a stage (a load generator's concurrency cap with no send times recorded), each stage is
replayed on its own, its users sending each request when another finishes.

A stage whose requests failed on the client (timeouts under overload) is reported `overloaded`:
its measured latencies cover only the survivors, which a replay that serves every request cannot
reproduce. Replayed with the load generator's timeout (`--client-timeout`, `trace.client_timeout`:
a request not finished by then is abandoned, its KV freed), such a stage is compared on its
survivors, as measured, and its failures counted beside the measured ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

from policylab.core.request import Status
from policylab.traces.loadgen.benchmark import Benchmark, MeasuredStage


@dataclass
class PredictedStage:
    stage: int
    requests: int
    ttft_mean: float
    e2e_mean: float
    per_token_interval: float     # (E2E mean - TTFT mean) / (mean output tokens - 1), as measured
    saturated: bool               # arrivals outran service: the queue grew through the stage, or clients gave up
    failed: int = 0               # requests abandoned by their client (a replay with a client timeout)


@dataclass
class StageComparison:
    measured: MeasuredStage
    predicted: Optional[PredictedStage]
    status: str                   # ok | saturated | overloaded (client failures, replayed without a client timeout)
    errors: dict = field(default_factory=dict)   # metric -> predicted / measured - 1


def run_overrides(bench: Benchmark, extra: list) -> list:
    """The run's Hydra overrides for `bench` (a user's `extra` overrides win: they come last)."""
    s = bench.server
    out = ["dataplane=sim", "policy=vllm_v1", f"model={bench.model}", f"hardware={bench.gpu}",
           f"dataplane.tensor_parallel={s.tensor_parallel}",
           f"dataplane.gpu_memory_utilization={s.gpu_memory_utilization}",
           f"engine.block_size={s.block_size}", f"engine.max_num_seqs={s.max_num_seqs}",
           f"engine.max_num_batched_tokens={s.max_num_batched_tokens}",
           f"engine.enable_prefix_caching={str(s.enable_prefix_caching).lower()}",
           f"trace.prefix_block_tokens={bench.prefix_block_tokens}", "logger=none", "plots=false", "progress=false"]
    if bench.model_config:
        out.append(f"model.config={bench.model_config}")
    if s.max_model_len:
        out.append(f"engine.max_model_len={s.max_model_len}")
    return out + list(extra)


KV_FILLED = 0.9             # a peak use from which the cache's size, not the load, sets the latencies


@dataclass
class KvUse:
    """The replay's KV cache: its size (vLLM logs it at startup as `GPU KV cache size: N tokens`), the
    most of it running requests held at once, and how many preemptions running out of it cost.
    Outputs long enough to fill the cache make the replay's latencies follow its size."""
    blocks: int
    block_size: int
    peak: float           # a share of the cache
    preemptions: int

    @property
    def tokens(self) -> int:
        return self.blocks * self.block_size

    @property
    def filled(self) -> bool:
        return self.peak >= KV_FILLED or self.preemptions > 0

    def describe(self) -> str:
        return (f"{self.tokens:,} tokens ({self.blocks:,} blocks); at most {self.peak:.0%} of it in use, "
                f"{self.preemptions:,} preemption{'s' if self.preemptions != 1 else ''}")


def kv_use(result) -> KvUse:
    """`result`'s KV use (a RunResult, or a StagedReplay's stages together)."""
    if isinstance(result, StagedReplay):
        return result.kv
    used = result.steps.get("kv_used_blocks")
    peak = float(used.max()) / result.num_blocks if used is not None and len(used) else 0.0
    preempted = result.steps.get("preempted")
    return KvUse(result.num_blocks, result.block_size, peak, int(preempted.sum()) if preempted is not None else 0)


@dataclass
class StagedReplay:
    """The replays of a benchmark sent stage by stage, as one: `requests` and `trace` in the
    benchmark's request order (what `predicted_stages` reads of a RunResult), `kv` their KV use."""
    requests: list
    trace: list
    kv: KvUse


def replay_benchmark(bench: Benchmark, extra: list = (), client: Optional[float] = None):
    """(the replay, typed run config) of `bench`'s trace on the sim: one run of the whole trace (stages
    in order, so the prefix cache carries over as on the server), or, where a stage was sent under a
    cap on requests in flight (`bench.concurrency`), one run a stage, each from an idle, empty server.
    Under a cap a request goes out at its arrival time or a client round trip after another ended,
    whichever is later: `client` seconds (default: the run's `client_latency`), as the client learns of
    the end and its request travels."""
    from policylab.apps.config import typed_config
    from policylab.apps.python_api import compose
    from omegaconf import open_dict
    cfg = compose(run_overrides(bench, list(extra)))
    with open_dict(cfg):
        del cfg["hydra"]
    run = typed_config(cfg)
    if bench.concurrency is None:
        return _replay(bench.name, run, list(bench.requests)), run
    gap = client_latency(run) if client is None else client
    requests, trace, uses = [None] * len(bench.requests), [None] * len(bench.requests), []
    for k, cap in zip([s.stage for s in bench.stages], bench.concurrency):
        ids = [i for i, s in enumerate(bench.stage_of) if s == k]
        if not ids:
            continue
        t0 = min(bench.requests[i].arrival_time for i in ids)
        stage = [replace(bench.requests[i], arrival_time=bench.requests[i].arrival_time - t0) for i in ids]
        name = f"{bench.name} stage {k}"
        result = _replay(name, run, closed_loop(name, stage, cap, gap) if cap else stage)
        for j, i in enumerate(ids):
            requests[i], trace[i] = result.requests[j], result.trace[j]
        uses.append(kv_use(result))
    kv = KvUse(max((u.blocks for u in uses), default=0), run.engine.block_size,
               max((u.peak for u in uses), default=0.0), sum(u.preemptions for u in uses))
    return StagedReplay(requests, trace, kv), run


def _replay(name: str, run, trace: list):
    from policylab.apps.jobs import build_engine
    result = build_engine(run, trace=trace).run()
    if result.partial:
        raise RuntimeError(f"the replay of {name} ended early: {result.error}")
    return result


def closed_loop(name: str, requests: list, users: int, gap: float = 0.0):
    """`requests`, in order, sent by `users` users: each sends its next request `gap` seconds after
    its last one ended, and not before the request's own arrival time (a load generator's cap on
    requests in flight; with every arrival at 0, `trace.concurrency` users with a round trip)."""
    from policylab.traces.session_load import closed_loop_trace
    from policylab.traces.sessions import one_turn_sessions, plan_of
    from policylab.traces.transforms import TraceReport
    return closed_loop_trace(plan_of(one_turn_sessions(requests), users, gap, paced=True), TraceReport(name, "loadgen"))


def replay_and_compare(bench: Benchmark, extra: list = (), timeout: Optional[float] = None,
                       client: Optional[float] = None) -> tuple:
    """(per-stage comparisons, typed run config, client latency, KV use) of `bench` replayed with
    `extra` overrides, its clients giving up after `timeout` seconds (None: never; its stages with
    failures then compare on their survivors), `client` seconds of client latency (default: the run's)."""
    giving_up = [] if timeout is None else [f"trace.client_timeout={timeout}"]
    result, run = replay_benchmark(bench, [*giving_up, *extra], client)
    client = client_latency(run) if client is None else client
    rows = compare(bench, predicted_stages(bench, result, client), timed_out=timeout is not None)
    return rows, run, client, kv_use(result)


def client_latency(cfg) -> float:
    """Seconds a load generator's TTFT and E2E hold beyond the engine's: the serving engine's
    `client_latency` (simulated planes; 0 for a measured or calibrated one)."""
    if getattr(cfg.dataplane, "kind", "") != "sim" or cfg.dataplane.calibration or cfg.dataplane.profile:
        return 0.0
    return cfg.serving_engine.client_latency


def predicted_stages(bench: Benchmark, result, client: float = 0.0) -> dict:
    """Per stage, the sim's TTFT, E2E and per-token interval of its finished requests, as the load
    generator measures them (from each request's send time, `client` seconds added to TTFT and E2E)."""
    out = {}
    stage_of = np.asarray(bench.stage_of)
    for k in sorted(set(bench.stage_of)):
        ids = np.nonzero(stage_of == k)[0]
        ttft, e2e, outs, queued, failed = [], [], [], [], 0
        for i in ids:
            r, t = result.requests[i], result.trace[i]
            if r is not None and r.status is Status.REJECTED and r.reject_reason.startswith("abandoned"):
                failed += 1
            if r is None or r.status is not Status.FINISHED or not r.token_times:
                continue
            ttft.append(r.token_times[0] - t.arrival_time)
            e2e.append(r.finish_time - t.arrival_time)
            outs.append(len(r.token_times))
            queued.append((r.first_scheduled_time or r.finish_time) - t.arrival_time)
        if not ttft:                   # (every request abandoned: only the failures to report)
            if failed:
                out[k] = PredictedStage(k, 0, math.nan, math.nan, math.nan, False, failed)
            continue
        ttft_mean, e2e_mean = float(np.mean(ttft)) + client, float(np.mean(e2e)) + client
        tokens = float(np.mean(outs))
        out[k] = PredictedStage(k, len(ttft), ttft_mean, e2e_mean,
                                (e2e_mean - ttft_mean) / (tokens - 1) if tokens > 1 else math.nan,
                                grew(queued) or failed > 0, failed)
    return out


def grew(queued: list) -> bool:
    """Whether queueing delay grew through the stage: its last quarter waits a second longer than
    its first (a stage the server keeps up with waits the same from start to end)."""
    q = len(queued) // 4
    return q > 0 and float(np.mean(queued[-q:])) - float(np.mean(queued[:q])) > 1.0


def compare(bench: Benchmark, predicted: dict, timed_out: bool = False) -> list:
    return [compare_stage(m, predicted.get(m.stage), timed_out) for m in bench.stages]


def compare_stage(m: MeasuredStage, p: Optional[PredictedStage], timed_out: bool = False) -> StageComparison:
    """Errors of one stage. A stage with client failures is `overloaded` unless the replay had the
    clients' timeout too (`timed_out`): then its survivors compare with the measured survivors."""
    if m.requests_failed and not timed_out:
        return StageComparison(m, p, "overloaded")
    if p is None or not p.requests:
        return StageComparison(m, p, "no prediction")
    errors = {}
    for key in ("ttft_mean", "e2e_mean", "per_token_interval"):
        measured, pred = getattr(m, key), getattr(p, key)
        if measured and measured > 0 and math.isfinite(pred):
            errors[key] = pred / measured - 1
    return StageComparison(m, p, "saturated" if p.saturated else "ok", errors)


def pair_text(measured: Optional[float], predicted: Optional[float], scale: float, fmt: str) -> str:
    """"measured / predicted" in a table's unit, a dash for a value there is none of (no request of
    the stage finished, or no replay of it)."""
    return " / ".join(f"{v * scale:{fmt}}" if v is not None and math.isfinite(v) else "-"
                      for v in (measured, predicted))


def error_text(errors: dict, key: str) -> str:
    return f"{errors[key] * 100:+.1f} %" if key in errors else "-"


def mape(rows: list, key: str) -> float:
    values = [abs(r.errors[key]) for r in rows if key in r.errors and r.status in ("ok", "saturated")]
    return float(np.mean(values)) if values else math.nan


TAIL_EXCESS_S = 0.002        # a stage whose mean TTFT exceeds its median by less has no tail worth sizing
TAIL_AGREEMENT = 0.1         # the replay's mean TTFT this close to the measured median: the typical request agrees


def stalls(duration: float, mean: float, median: float, p99: float) -> Optional[tuple]:
    """(count, seconds) of equal stalls that give a stage both its mean TTFT's excess over the median
    and its p99, or None where the mean is within TAIL_EXCESS_S of the median. A stall of s seconds
    delays each request arriving during it by what is left of it (s/2 on average; no backlog after
    it), so k stalls add k s^2 / (2 T) to the mean TTFT of a stage of T seconds, and put k (s - (p99 -
    median)) seconds of arrivals, 1 % of them, above the p99: k s^2 = 2 T D and k (s - d) = 0.01 T, so
    s^2 = 200 D (s - d). Where sampling leaves no exact solution (200 D < 4 d), the closest one: s = 2 d."""
    excess, over = mean - median, p99 - median
    if not (excess >= TAIL_EXCESS_S and over > 0 and duration > 0):       # (NaN included)
        return None
    a = 200.0 * excess
    disc = a * a - 4.0 * a * over
    s = (a + math.sqrt(disc)) / 2.0 if disc >= 0 else 2.0 * over
    return 2.0 * duration * excess / (s * s), s


def tail_size(m: MeasuredStage) -> Optional[str]:
    """A measured stage's TTFT tail sized as `stalls`, in words, or None where it has none."""
    found = stalls(m.duration, m.ttft_mean, m.ttft_median, m.ttft_p99)
    if found is None:
        return None
    return (f"mean {(m.ttft_mean - m.ttft_median) * 1e3:.1f} ms above the median ({m.ttft_median * 1e3:.1f} ms), "
            f"p99 {m.ttft_p99 * 1e3:.0f} ms: as {found[0]:.1f} stalls of {found[1]:.2f} s in {m.duration:.0f} s")


def tail_note(c: StageComparison) -> Optional[str]:
    """A line for a stage whose measured mean TTFT carries a tail the replay's typical request does not
    explain: the replay agrees with the measured median (within TAIL_AGREEMENT), no request failed, the
    replay kept up, and the mean sits well above the median; sized as `tail_size`."""
    m, p = c.measured, c.predicted
    if p is None or c.status != "ok" or m.requests_failed or not 0 < m.ttft_median < math.inf:
        return None
    off = abs(p.ttft_mean / m.ttft_median - 1)
    size = tail_size(m) if off <= TAIL_AGREEMENT else None
    if size is None:
        return None
    return (f"stage {m.stage}: the replay's mean TTFT ({p.ttft_mean * 1e3:.1f} ms) is within {off * 100:.1f} % of "
            f"the measured median; the measured TTFT {size} (a server not yet warm, compiling kernels for new "
            "batch shapes? the replay serves a warm engine)")
