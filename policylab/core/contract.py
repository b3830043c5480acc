"""The step contract between a scheduling policy and the engine (DESIGN §3).

A policy receives a read-only `SchedulerView` and returns a `StepPlan`. The engine
validates every plan with `validate_plan` before touching any state; a broken rule
raises `ContractViolation` naming the policy and the rule. Nothing is silently fixed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat
from operator import is_
from typing import TYPE_CHECKING, AbstractSet, Callable, Mapping

if TYPE_CHECKING:
    from policylab.core.kv import BlockManager
    from policylab.core.request import Request


class ContractViolation(Exception):
    """A plan broke a rule of the contract; carries the policy and the rule names."""

    def __init__(self, policy: str, rule: str, detail: str):
        self.policy, self.rule, self.detail = policy, rule, detail
        super().__init__(f"policy '{policy}' broke rule '{rule}': {detail}")


class RequestView:
    """Read-only window on one live request. Never exposes the true output length."""

    __slots__ = ("_r", "_kv", "_hit_step", "_hit_blocks")

    def __init__(self, request: "Request", kv: "BlockManager"):
        self._r, self._kv = request, kv
        self._hit_step, self._hit_blocks = -1, ()

    req_id = property(lambda s: s._r.req_id)
    arrival_time = property(lambda s: s._r.arrival_time)
    client = property(lambda s: s._r.client)
    priority = property(lambda s: s._r.priority)
    ttft_slo = property(lambda s: s._r.ttft_slo)
    tpot_slo = property(lambda s: s._r.tpot_slo)
    max_tokens = property(lambda s: s._r.max_tokens)
    predicted_output_tokens = property(lambda s: s._r.predicted_output_tokens)
    prompt_len = property(lambda s: len(s._r.prompt_ids))
    num_output_tokens = property(lambda s: len(s._r.output_ids))
    num_tokens = property(lambda s: s._r.num_tokens)
    num_computed_tokens = property(lambda s: s._r.num_computed_tokens)
    num_blocks = property(lambda s: len(s._r.block_table))
    num_preemptions = property(lambda s: s._r.num_preemptions)
    first_scheduled_time = property(lambda s: s._r.first_scheduled_time)
    first_token_time = property(lambda s: s._r.token_times[0] if s._r.token_times else None)
    last_token_time = property(lambda s: s._r.token_times[-1] if s._r.token_times else None)
    status = property(lambda s: s._r.status.value)

    def cached_blocks(self) -> tuple:
        """Prefix-cache blocks this request would reuse if scheduled now (memoized per step)."""
        r = self._r
        if r.block_table or r.num_computed_tokens:
            return ()
        if self._hit_step != self._kv.epoch:
            self._hit_step = self._kv.epoch
            self._hit_blocks = self._kv.lookup(r.block_hashes, (r.num_tokens - 1) // self._kv.block_size)
        return self._hit_blocks

    @property
    def num_cached_tokens(self) -> int:
        """Tokens served from the prefix cache if scheduled now (always leaves one to compute)."""
        return len(self.cached_blocks()) * self._kv.block_size

    @property
    def remaining_tokens(self) -> int:
        """Most tokens this request may be given this step (prefill remainder, or 1 for decode)."""
        r = self._r
        return r.num_tokens - r.num_computed_tokens - self.num_cached_tokens

    @property
    def is_decode(self) -> bool:
        r = self._r
        out = r.output_ids
        return bool(out) and len(r.prompt_ids) + len(out) - r.num_computed_tokens == 1

    @property
    def is_prefill(self) -> bool:
        return not self.is_decode

    def __repr__(self) -> str:
        return (f"RequestView(id={self.req_id}, {self.status}, prompt={self.prompt_len}, "
                f"computed={self.num_computed_tokens}, out={self.num_output_tokens})")


class ReadOnlyPlanTokens(dict):
    """A plan mapping the engine built and trusts unread (`SchedulerView.decode_all`): it refuses
    changes; copies of it (`dict(...)`, `copy`, `deepcopy`, pickle) are plain dicts."""

    __slots__ = ()

    def _refuse(self, *args, **kwargs):
        raise TypeError("view.decode_all is read-only; change a copy: dict(view.decode_all)")

    __setitem__ = __delitem__ = __ior__ = update = pop = popitem = clear = setdefault = _refuse

    def copy(self) -> dict:
        return dict(self)

    def __reduce__(self):
        return dict, (dict(self),)


@dataclass(slots=True)
class SchedulerView:
    """Everything a policy may read in one step. Lists are in queue order."""

    clock: float
    step: int
    waiting: tuple           # RequestView, queue order (preempted requests first, then arrival)
    running: tuple           # RequestView, order in which they started running
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    num_free_blocks: int
    num_total_blocks: int
    blocks_needed: Callable[[RequestView, int], int]
    blocks_freed_by_preempting: Callable[[RequestView], int]
    plan_kv: Callable[["StepPlan"], tuple]   # exact (blocks needed, blocks available) of a whole plan
    by_id: Mapping[int, RequestView]   # every waiting and running request, read-only
    # Whole-batch facts for policies that serve hundreds of decodes per step: set operations
    # on these (read-only, live) replace a loop over views.
    running_ids: tuple                 # req_ids of `running`, same order
    decoding: AbstractSet[int]         # running req_ids whose next step is one decode token
    needs_block: AbstractSet[int]      # decoding req_ids whose last KV block is full: one more
                                       # token takes a new block (the others take none)
    decode_all: ReadOnlyPlanTokens     # read-only {req_id: 1} over `running_ids`, in order: the
                                       # plan "every running request decodes". Returned as is
                                       # (`StepPlan(view.decode_all)`), the engine that built it
                                       # skips re-reading it request by request


@dataclass
class StepPlan:
    """A policy's decision for one step (vLLM's `SchedulerOutput.num_scheduled_tokens`).

    `num_scheduled_tokens` maps req_id -> tokens this step, in the order the batch is
    formed; `preempt` lists running req_ids whose KV is freed (recomputed later);
    `reject` maps waiting req_ids to a reason (admission control: reported, never dropped).
    """

    num_scheduled_tokens: dict = field(default_factory=dict)
    preempt: list = field(default_factory=list)
    reject: dict = field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())


def validate_plan(view: SchedulerView, plan: StepPlan, policy: str) -> bool:
    """Check every rule of DESIGN §3; raise ContractViolation on the first broken one.

    Returns True when the plan schedules running decodes only (the engine's fast path).
    """
    if not isinstance(plan, StepPlan):
        raise ContractViolation(policy, "plan_type",
                                f"schedule() must return a StepPlan, got {type(plan).__name__}")
    live, sched = view.by_id, plan.num_scheduled_tokens
    if len(sched) > view.max_num_seqs:
        raise ContractViolation(policy, "seq_cap",
                                f"{len(sched)} requests scheduled > max_num_seqs={view.max_num_seqs}")
    decode_only = is_decode_only(view, plan)
    if decode_only and (sched is view.decode_all or all(map(is_, sched.values(), repeat(1)))):
        full = view.needs_block        # every decoding request scheduled: all of them
        blocks = len(full) if len(sched) == len(view.decoding) else len(full & sched.keys())
        free = view.num_free_blocks
    else:        # (`is 1` holds for every int 1 in CPython; anything else is checked below)
        if not set(map(type, sched.values())) <= {int}:
            rid, n = next((rid, n) for rid, n in sched.items() if type(n) is not int)
            raise ContractViolation(policy, "chunk_type",
                                    f"request {rid}: token count must be int, got {n!r}")
        preempt_set = set(plan.preempt)
        if len(preempt_set) != len(plan.preempt):
            raise ContractViolation(policy, "unique",
                                    f"a request appears twice in the preempt list {plan.preempt}")
        for rid in plan.preempt:
            v = live.get(rid)
            if v is None or v.status != "running":
                raise ContractViolation(policy, "preempt_running",
                                        f"request {rid} is not running and cannot be preempted")
            if rid in sched:
                raise ContractViolation(policy, "preempted_scheduled",
                                        f"request {rid} is both preempted and scheduled")
        for rid, reason in plan.reject.items():
            v = live.get(rid)
            if v is None or v.status != "waiting":
                raise ContractViolation(policy, "reject_waiting",
                                        f"request {rid} is not waiting and cannot be rejected")
            if rid in sched:
                raise ContractViolation(policy, "rejected_scheduled",
                                        f"request {rid} is both rejected and scheduled")
            if not reason or not isinstance(reason, str):
                raise ContractViolation(policy, "reject_reason", f"request {rid} rejected without a reason")
        if not sched.keys() <= live.keys():
            rid = next(rid for rid in sched if rid not in live)
            raise ContractViolation(policy, "unknown_request",
                                    f"request {rid} is neither waiting nor running")
        for rid, n in sched.items():
            v = live[rid]
            r = v._r
            out = r.output_ids
            left = len(r.prompt_ids) + len(out) - r.num_computed_tokens   # known tokens not in the cache yet
            if left == 1 and out:
                if n != 1:
                    raise ContractViolation(policy, "decode_one",
                                            f"request {rid} is decoding and must get exactly 1 token, got {n}")
            elif not 1 <= n <= (left if r.block_table else v.remaining_tokens):
                raise ContractViolation(policy, "chunk_bounds",
                                        f"request {rid} in prefill got {n} tokens, "
                                        f"allowed 1..{v.remaining_tokens}")
        blocks, free = view.plan_kv(plan)
    total = len(sched) if decode_only else sum(sched.values())
    if total > view.max_num_batched_tokens:
        raise ContractViolation(policy, "token_budget",
                                f"{total} tokens scheduled > "
                                f"max_num_batched_tokens={view.max_num_batched_tokens}")
    if blocks > free:
        raise ContractViolation(policy, "kv_capacity",
                                f"plan needs {blocks} KV blocks but only {free} are free after preemptions")
    return decode_only


def is_decode_only(view: SchedulerView, plan: StepPlan) -> bool:
    """True when the plan only schedules running decodes (no preemption, no rejection)."""
    sched = plan.num_scheduled_tokens
    if plan.preempt or plan.reject or not sched:
        return False
    if len(view.running_ids) == len(view.decoding) and (sched is view.decode_all or (
            len(sched) == len(view.running_ids) and tuple(sched) == view.running_ids)):
        return True                    # every running request decodes, in running order: the usual plan
    return sched.keys() <= view.decoding
