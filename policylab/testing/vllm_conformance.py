"""Step-by-step conformance with vLLM's own scheduler (needs `vllm` importable; imported lazily).

One `VllmScenario` is replayed twice: by vLLM's real v1 `Scheduler` (bare: no model, each step's
`ModelRunnerOutput` fabricated, one sampled token for every request whose known tokens the step
completes) and by policylab's `Engine` on the sim data plane with a policy (by default
`vllm_v1` with the scenario's knobs). Both sides run on the same clock: a step that schedules
tokens takes one time unit, requests arrive at integer times, and an idle scheduler jumps to
the next arrival. The sides must agree, step by step, on `num_scheduled_tokens`, the
preempted requests and the finished ones; `first_divergence` names the first step where they
do not, with both sides' state before it.

    from policylab.testing.vllm_conformance import VllmScenario, VllmRequest, check_conformance
    s = VllmScenario(requests=(VllmRequest(0, tuple(range(1, 301)), 20),), num_blocks=64)
    check_conformance(s)          # raises ConformanceError showing the first divergent step

vLLM reserves block 0 as its null block, so it is given `num_blocks + 1` blocks for the
`num_blocks` policylab manages. Sampled ids are the sim data plane's (a function of the
position), handed to vLLM so that both sides hash the same output blocks.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.core.contract import StepPlan
from policylab.dataplane.config import DataplaneConfig
from policylab.core.engine import Engine
from policylab.core.request import TraceRequest
from policylab.dataplane.sim import SimDataPlane
from policylab.testing.vllm_models import tiny_llama_dir

VLLM_VERSION = "0.32.0"     # the vLLM `policies/vllm_v1.py` is pinned to
STALL_STEPS = 300           # steps without a token or a finish that end a run as a livelock


@dataclass(frozen=True)
class VllmRequest:
    arrival: int                 # time unit (a step that schedules tokens takes one)
    prompt_ids: tuple            # token ids (shared prefixes: equal leading ids)
    output_tokens: int           # generated until this many (ignore_eos)
    priority: int = 0            # lower first, under policy: priority


@dataclass(frozen=True)
class VllmScenario:
    """A trace plus the engine and scheduler settings, under vLLM's names."""

    requests: tuple
    num_blocks: int = 128                    # usable KV blocks (vLLM gets one more: its null block)
    block_size: int = 32
    max_num_batched_tokens: int = 256
    max_num_seqs: int = 8
    max_model_len: int = 4096
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    scheduler_reserve_full_isl: bool = True
    policy: str = "fcfs"
    watermark: float = 0.0

    def ordered(self) -> tuple:
        """Requests by arrival (stable): index i is policylab's req_id i and vLLM's request id."""
        return tuple(sorted(self.requests, key=lambda r: r.arrival))


@dataclass
class StepRecord:
    """One step that scheduled tokens or preempted, and the state it started from."""

    time: float
    tokens: dict                              # req index -> tokens scheduled, in batch order
    preempted: tuple = ()
    finished: tuple = ()
    waiting: tuple = ()                       # req indices in queue order, before the step
    running: tuple = ()                       # (req index, computed tokens) before the step
    free_blocks: int = 0
    hits_before: dict = field(default_factory=dict)   # waiting req -> prefix-cache hit (tokens) before the step
    hits: dict = field(default_factory=dict)          # admitted req -> the hit it was admitted with

    def key(self) -> tuple:
        return self.time, self.tokens, frozenset(self.preempted), frozenset(self.finished), self.hits


class ConformanceError(AssertionError):
    pass


# --------------------------------------------------------------------------- policylab side
def vllm_v1_policy(s: VllmScenario):
    from policies.vllm_v1 import VllmV1
    return VllmV1(enable_chunked_prefill=s.enable_chunked_prefill,
                  long_prefill_token_threshold=s.long_prefill_token_threshold,
                  scheduler_reserve_full_isl=s.scheduler_reserve_full_isl, policy=s.policy,
                  watermark=s.watermark)


class _UnitSteps:
    """The sim data plane's sampled ids, each step one time unit long."""

    def __init__(self, seed: int = 0):
        self.inner = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"), seed=seed)
        self.vocab_size, self.eos_token_id, self.capabilities = self.inner.vocab_size, None, frozenset()
        self.kind = "vllm_unit_steps"

    def num_kv_blocks(self, block_size: int) -> int:
        return self.inner.num_kv_blocks(block_size)

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        self.inner.allocate_kv(num_blocks, block_size)

    def execute(self, batch):
        result = self.inner.execute(batch)
        return result._replace(duration=1.0)


def _admitted_hits(view, plan, hits: dict) -> dict:
    """The prefix-cache hit (tokens) each waiting request of the plan starts on: its hit before the
    step, plus under publish-on-schedule the blocks the entries before it compute this step."""
    admitted, before = {}, StepPlan({})
    for rid, n in plan.num_scheduled_tokens.items():
        if rid in hits:
            v = view.by_id[rid]
            hit = hits[rid] + v.remaining_tokens - view.remaining_tokens_after(before, v)
            if hit:
                admitted[rid] = hit
        before.num_scheduled_tokens[rid] = n
    return admitted


class _Recorder:
    """Wraps the policy: records each non-empty plan with the view it was made from."""

    def __init__(self, policy):
        self.inner, self.name, self.records = policy, getattr(policy, "name", "policy"), []

    def schedule(self, view):
        plan = self.inner.schedule(view)
        if plan.num_scheduled_tokens or plan.preempt:
            hits = {v.req_id: v.num_cached_tokens for v in view.waiting}   # the engine takes exactly these
            self.records.append(StepRecord(
                view.clock, dict(plan.num_scheduled_tokens), tuple(sorted(plan.preempt)),
                waiting=tuple(hits), running=tuple((v.req_id, v.num_computed_tokens) for v in view.running),
                free_blocks=view.num_free_blocks, hits_before={r: n for r, n in hits.items() if n},
                hits=_admitted_hits(view, plan, hits)))
        return plan

    def on_finished(self, view) -> None:
        if self.records:                  # (a request rejected on arrival finishes before any step)
            self.records[-1].finished += (view.req_id,)
        hook = getattr(self.inner, "on_finished", None)
        if hook is not None:
            hook(view)


def engine_config(s: VllmScenario) -> EngineConfig:
    return EngineConfig(block_size=s.block_size, num_blocks=s.num_blocks,
                        max_num_batched_tokens=s.max_num_batched_tokens, max_num_seqs=s.max_num_seqs,
                        max_model_len=s.max_model_len, enable_prefix_caching=s.enable_prefix_caching,
                        publish_on_schedule=True, check_invariants=True, max_stall_steps=STALL_STEPS)


def run_policylab(s: VllmScenario, policy=None) -> tuple:
    """(step records, output ids per request, prefix-cache tokens, livelocked) of policylab's engine
    with `policy` (default vllm_v1). A run that livelocks (preempting and readmitting without
    progress for STALL_STEPS steps) keeps its records: vLLM must then livelock the same way."""
    recorder = _Recorder(policy if policy is not None else vllm_v1_policy(s))
    trace = [TraceRequest(arrival_time=float(r.arrival), prompt_tokens=len(r.prompt_ids),
                          output_tokens=r.output_tokens, priority=r.priority, prompt_ids=tuple(r.prompt_ids))
             for r in s.ordered()]
    result = Engine(trace, recorder, _UnitSteps(), engine_config(s)).run()
    livelocked = result.status != "complete" and "'liveness'" in str(getattr(result, "error", ""))
    if result.status != "complete" and not livelocked:
        raise ConformanceError(f"policylab's run ended {result.status}: {getattr(result, 'error', '')}")
    rejected = [r.req_id for r in result.requests if r.reject_reason]
    if rejected:
        raise ConformanceError(f"policylab rejected requests {rejected} (vLLM would queue them): "
                               f"{result.requests[rejected[0]].reject_reason}")
    return (recorder.records, [list(r.output_ids) for r in result.requests],
            sum(r.num_cached_tokens_total for r in result.requests), livelocked)


# ------------------------------------------------------------------------------ vLLM side
def vllm_scheduler(s: VllmScenario):
    """vLLM's v1 Scheduler for the scenario, bare (no model runner)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch
    import vllm
    from vllm.config import CacheConfig, ModelConfig as VModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager
    if vllm.__version__ != VLLM_VERSION:
        raise ConformanceError(f"vllm_v1 is pinned to vLLM {VLLM_VERSION}, this is vLLM {vllm.__version__}")
    knobs = dict(max_num_batched_tokens=s.max_num_batched_tokens, max_num_seqs=s.max_num_seqs,
                 enable_chunked_prefill=s.enable_chunked_prefill,
                 long_prefill_token_threshold=s.long_prefill_token_threshold,
                 scheduler_reserve_full_isl=s.scheduler_reserve_full_isl, policy=s.policy, watermark=s.watermark)
    cache = CacheConfig(block_size=s.block_size, enable_prefix_caching=s.enable_prefix_caching)
    cache.num_gpu_blocks = s.num_blocks + 1
    config = VllmConfig(model_config=VModelConfig(model=tiny_llama_dir(), skip_tokenizer_init=True,
                                                  max_model_len=s.max_model_len, dtype="float32"),
                        scheduler_config=SchedulerConfig(max_model_len=s.max_model_len, is_encoder_decoder=False,
                                                         **knobs),
                        cache_config=cache)
    changed = {k: getattr(config.scheduler_config, k) for k, v in knobs.items()
               if getattr(config.scheduler_config, k) != v}
    if changed:
        raise ConformanceError(f"vLLM's config changed scheduler settings: {changed}")
    spec = FullAttentionSpec(block_size=s.block_size, num_kv_heads=1, head_size=32, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=s.num_blocks + 1, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn"], spec)])
    return Scheduler(config, kv, StructuredOutputManager(config), block_size=s.block_size)


def vllm_requests(s: VllmScenario) -> list:
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request
    hasher = None
    if s.enable_prefix_caching:
        init_none_hash(sha256)
        hasher = get_request_block_hasher(s.block_size, sha256)
    return [Request(request_id=f"{i:06d}", prompt_token_ids=list(r.prompt_ids),
                    sampling_params=SamplingParams(max_tokens=r.output_tokens, ignore_eos=True),
                    pooling_params=None, arrival_time=float(r.arrival), priority=r.priority, block_hasher=hasher)
            for i, r in enumerate(s.ordered())]


def run_vllm(s: VllmScenario, output_ids: list, max_steps: int = 100_000, max_records: Optional[int] = None) -> list:
    """Step records of vLLM's bare scheduler; the k-th token request i samples is output_ids[i][k]
    (ids past those are a fixed one). `max_records`: stop after that many records (a livelock)."""
    from vllm.v1.outputs import ModelRunnerOutput
    sched, requests = vllm_scheduler(s), vllm_requests(s)
    arrivals, now, records = [r.arrival for r in s.ordered()], 0.0, []
    added = done = 0
    for _ in range(max_steps):
        while added < len(requests) and arrivals[added] <= now:
            sched.add_request(requests[added])
            added += 1
        if done == len(requests):
            return records
        if not sched.running and not len(sched.waiting):
            now = float(arrivals[added])
            continue
        kv = sched.kv_cache_manager
        waiting = tuple(int(r.request_id) for r in sched.waiting)
        hits_before = {int(r.request_id): kv.get_computed_blocks(r)[1] for r in sched.waiting} \
            if s.enable_prefix_caching else {}
        state = dict(waiting=waiting, running=tuple((int(r.request_id), r.num_computed_tokens) for r in sched.running),
                     free_blocks=kv.block_pool.get_num_free_blocks(),
                     hits_before={r: n for r, n in hits_before.items() if n})
        out = sched.schedule()
        ids = list(out.num_scheduled_tokens)
        hits = {int(rid): requests[int(rid)].num_computed_tokens - n for rid, n in out.num_scheduled_tokens.items()
                if int(rid) in hits_before and requests[int(rid)].num_computed_tokens > n}
        sampled = []
        for rid in ids:
            r = sched.requests[rid]
            ids_of = output_ids[int(rid)]
            k = r.num_output_tokens
            sampled.append([ids_of[k] if k < len(ids_of) else 17] if r.num_computed_tokens >= r.num_tokens else [])
        preempted = tuple(sorted(int(rid) for rid in out.preempted_req_ids or ()))
        if ids:
            sched.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in
                                                                                         enumerate(ids)},
                                                            sampled_token_ids=sampled))
        finished = tuple(int(rid) for rid in ids if requests[int(rid)].is_finished())
        done += len(finished)
        if ids or preempted:
            records.append(StepRecord(now, {int(rid): n for rid, n in out.num_scheduled_tokens.items()},
                                      preempted, finished, hits=hits, **state))
            if len(records) == max_records:
                return records
        if ids:
            now += 1.0
        elif not preempted:
            if added == len(requests):
                raise ConformanceError("vLLM scheduled nothing and no request is left to arrive")
            now = float(arrivals[added])
    raise ConformanceError(f"vLLM did not finish within {max_steps} steps")


# ----------------------------------------------------------------------------- comparison
@dataclass
class Divergence:
    step: int
    policylab: Optional[StepRecord]
    vllm: Optional[StepRecord]

    @property
    def cause(self) -> str:
        """'policy', or where the two engines' prefix caches (not the schedulers) part ways:
        'kv: cache contents' when the same waiting request would hit a different prefix before the
        step (the caches evict in different orders), 'kv: same-step hit' when vLLM's hit changed during
        the step (it publishes a block when the block is scheduled, and evicts while allocating;
        policylab's engine publishes it once computed and takes every hit before allocating)."""
        a, b = self.policylab, self.vllm
        if a is None or b is None:
            return "policy"
        if a.hits_before != b.hits_before:
            return "kv: cache contents"
        if any(b.hits_before.get(r, 0) != n for r, n in b.hits.items()) or \
                any(b.hits.get(r, 0) != n for r, n in b.hits_before.items() if r in b.tokens):
            return "kv: same-step hit"
        return "policy"

    @property
    def engine_kv(self) -> bool:
        return self.cause != "policy"

    def __str__(self) -> str:
        lines = [f"first divergence at step {self.step} (cause: {self.cause}):"]
        for side, r in (("policylab", self.policylab), ("vLLM", self.vllm)):
            if r is None:
                lines.append(f"  {side:9s}: no such step (its run ended)")
                continue
            lines.append(f"  {side:9s}: t={r.time:g} tokens={r.tokens} preempted={list(r.preempted)} "
                         f"finished={list(r.finished)}")
            lines.append(f"  {'':9s}  before: free_blocks={r.free_blocks} running(id, computed)={list(r.running)} "
                         f"waiting={list(r.waiting)} hits={r.hits_before} admitted with hits={r.hits}")
        return "\n".join(lines)


@dataclass
class Comparison:
    policylab: list
    vllm: list
    divergence: Optional[Divergence] = None
    cached_tokens: int = 0          # prompt tokens policylab served from the prefix cache
    livelocked: bool = False        # both sides preempt and readmit without end (compared that far)

    @property
    def steps(self) -> tuple:
        return len(self.policylab), len(self.vllm)

    @property
    def preemptions(self) -> tuple:
        return tuple(sum(len(r.preempted) for r in side) for side in (self.policylab, self.vllm))



def first_divergence(ours: list, theirs: list) -> Optional[Divergence]:
    for k in range(max(len(ours), len(theirs))):
        a = ours[k] if k < len(ours) else None
        b = theirs[k] if k < len(theirs) else None
        if a is None or b is None or a.key() != b.key():
            return Divergence(k, a, b)
    return None


def compare(s: VllmScenario, policy=None) -> Comparison:
    """Replay `s` on both sides (policylab with `policy`, default vllm_v1) and compare them."""
    ours, output_ids, cached, livelocked = run_policylab(s, policy)
    theirs = run_vllm(s, output_ids, max_records=len(ours) if livelocked else None)
    return Comparison(ours, theirs, first_divergence(ours, theirs), cached, livelocked)


def check_conformance(s: VllmScenario, policy=None, allow_kv_differences: bool = False) -> Comparison:
    """compare(), raising ConformanceError with the first divergent step when the sides differ.

    `allow_kv_differences`: a divergence whose cause is the engines' prefix caches (see
    `Divergence.cause`) is returned instead of raised; the steps up to it were identical."""
    result = compare(s, policy)
    d = result.divergence
    if d is not None and not (allow_kv_differences and d.engine_kv):
        raise ConformanceError(f"{s}\n{d}")
    return result
