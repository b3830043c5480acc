"""The step contract between a scheduling policy and the engine (DESIGN §3).

A policy receives a read-only `SchedulerView` and returns a `StepPlan`. The engine
validates every plan with `validate_plan` before touching any state; a broken rule
raises `ContractViolation` naming the policy and the rule. Nothing is silently fixed.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import islice, repeat
from operator import is_
from typing import TYPE_CHECKING, AbstractSet, Mapping, NamedTuple, Sequence

from policylab.core.kv import blocks_for

if TYPE_CHECKING:
    from policylab.core.kv import BlockManager
    from policylab.core.request import Request


class ContractViolation(Exception):
    """A plan broke a rule of the contract; carries the policy and the rule names."""

    def __init__(self, policy: str, rule: str, detail: str):
        self.policy, self.rule, self.detail = policy, rule, detail
        self.step = self.time = None
        super().__init__(f"policy '{policy}' broke rule '{rule}': {detail}")

    def locate(self, step: int, time: float) -> None:
        """Name the engine step whose plan broke the rule (once; the message then ends with it)."""
        if self.step is None:
            self.step, self.time = step, time
            self.args = (f"{self.args[0]} (at step {step}, t={time:.6g} s)",)


class RequestView:
    """Read-only window on one live request. Never exposes the true output length.

    Its slots are hidden (their descriptors are taken off the class below): no attribute of a
    view leads to the engine's `Request` or block manager, and no attribute of it can be set.
    """

    __slots__ = ("_r", "_kv", "_hit")

    def __new__(cls, request: "Request", kv: "BlockManager"):   # (no __init__: calling it again on
        self = object.__new__(cls)                                 # a live view cannot rebind it)
        _set_request(self, request)
        _set_kv(self, kv)
        _set_hit(self, (-1, ()))
        return self

    req_id = property(lambda s: _request(s).req_id)
    arrival_time = property(lambda s: _request(s).arrival_time)
    client = property(lambda s: _request(s).client)
    priority = property(lambda s: _request(s).priority)
    ttft_slo = property(lambda s: _request(s).ttft_slo)
    tpot_slo = property(lambda s: _request(s).tpot_slo)
    max_tokens = property(lambda s: _request(s).max_tokens)
    predicted_output_tokens = property(lambda s: _request(s).predicted_output_tokens)
    prompt_len = property(lambda s: len(_request(s).prompt_ids))
    num_output_tokens = property(lambda s: len(_request(s).output_ids))
    num_tokens = property(lambda s: _request(s).num_tokens)
    num_computed_tokens = property(lambda s: _request(s).num_computed_tokens)
    num_blocks = property(lambda s: len(_request(s).block_table))
    num_preemptions = property(lambda s: _request(s).num_preemptions)
    first_scheduled_time = property(lambda s: _request(s).first_scheduled_time)
    first_token_time = property(lambda s: _request(s).token_times[0] if _request(s).token_times else None)
    last_token_time = property(lambda s: _request(s).token_times[-1] if _request(s).token_times else None)
    status = property(lambda s: _request(s).status.value)

    def cached_blocks(self) -> tuple:
        """Prefix-cache blocks this request would reuse if scheduled now (memoized per step)."""
        r = _request(self)
        if r.block_table or r.num_computed_tokens:
            return ()
        kv = _kv(self)
        step, blocks = _hit(self)
        if step != kv.epoch:
            blocks = kv.lookup(r.block_hashes, (r.num_tokens - 1) // kv.block_size)
            _set_hit(self, (kv.epoch, blocks))
        return blocks

    @property
    def num_cached_tokens(self) -> int:
        """Tokens served from the prefix cache if scheduled now (always leaves one to compute)."""
        return len(self.cached_blocks()) * _kv(self).block_size

    @property
    def remaining_tokens(self) -> int:
        """Most tokens this request may be given this step (prefill remainder, or 1 for decode)."""
        r = _request(self)
        return r.num_tokens - r.num_computed_tokens - self.num_cached_tokens

    @property
    def is_decode(self) -> bool:
        r = _request(self)
        out = r.output_ids
        return bool(out) and len(r.prompt_ids) + len(out) - r.num_computed_tokens == 1

    @property
    def is_prefill(self) -> bool:
        return not self.is_decode

    def __repr__(self) -> str:
        return (f"RequestView(id={self.req_id}, {self.status}, prompt={self.prompt_len}, "
                f"computed={self.num_computed_tokens}, out={self.num_output_tokens})")


def _hide_slot(cls, name: str) -> tuple:
    """(get, set) of a slot whose descriptor is removed from the class: only this module reaches it."""
    descriptor = cls.__dict__[name]
    delattr(cls, name)
    return descriptor.__get__, descriptor.__set__


(request_of, _set_request), (_kv, _set_kv) = _hide_slot(RequestView, "_r"), _hide_slot(RequestView, "_kv")
_hit, _set_hit = _hide_slot(RequestView, "_hit")      # (kv epoch, blocks) of the memoized cache lookup
_request = request_of     # the engine's Request behind a view: for the engine and validate_plan only


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


class SchedulerView(NamedTuple):
    """Everything a policy may read in one step. Lists are in queue order.

    Immutable (a named tuple: built positionally in one C call, every step), and every value in
    it is read-only: tuples, read-only mappings and views. The engine validates a plan against
    the view it built, so a policy cannot raise its own limits, and no attribute leads from a
    view to engine state (the methods below reach requests through hidden slots).
    """

    clock: float
    step: int
    waiting: Sequence[RequestView]   # live and read-only (no copy): queue order, preempted
                                     # requests first (latest preemption first), then arrivals
    running: tuple           # RequestView, order in which they started running
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    num_free_blocks: int
    num_total_blocks: int
    by_id: Mapping[int, RequestView]   # every waiting and running request, read-only
    # Whole-batch facts for policies that serve hundreds of decodes per step: set operations
    # on these (read-only, live) replace a loop over views.
    running_ids: tuple                 # req_ids of `running`, same order
    decoding: AbstractSet[int]         # running req_ids whose next step is one decode token
    needs_block: AbstractSet[int]      # decoding req_ids whose last KV block is full: one more
                                       # token takes a new block (the others take none)
    decode_all: ReadOnlyPlanTokens     # read-only {req_id: 1} over the `decoding` requests, in
                                       # running order: the plan "every decode gets its token".
                                       # Returned as is (`StepPlan(view.decode_all)`), or copied
                                       # and extended with prefill chunks (`dict(view.decode_all)`,
                                       # then add), the engine that built it checks the decodes as
                                       # one block instead of request by request (`leading_decodes`)
    # What changed since the previous schedule() call, so a policy can keep orderings and
    # counters across steps and update only what moved (the rest of its state stays valid).
    sampled: Sequence[int]             # req_ids given an output token by the last executed step
                                       # (batch order; those that then finished included)
    arrived: Sequence[int]             # req_ids that joined `waiting` as new arrivals (in order)

    def blocks_needed(self, v: RequestView, n: int) -> int:
        """Free blocks that giving `n` more tokens to this request consumes (cache hits included)."""
        r, bs = _request(v), _kv(v).block_size
        if r.block_table:        # running: no cache lookup, just the tail of its table
            need = blocks_for(r.num_computed_tokens + n, bs) - len(r.block_table)
            return need if need > 0 else 0
        hits = v.cached_blocks()
        new = blocks_for(r.num_computed_tokens + len(hits) * bs + n, bs) - len(r.block_table) - len(hits)
        return max(new, 0) + (_kv(v).reclaim_cost(hits) if hits else 0)

    def blocks_freed_by_preempting(self, v: RequestView) -> int:
        return _kv(v).freed_by_release(_request(v).block_table)

    def plan_kv(self, plan: "StepPlan") -> tuple:
        """Exact (blocks needed, blocks available) of a whole plan, its preemptions included.

        A cache hit on a block that nobody holds after the preemptions takes a free block
        (counted once even when several requests hit it). Every id must be in `by_id`.
        """
        return self._plan_kv(plan, leading_decodes(self, plan.num_scheduled_tokens))

    def _plan_kv(self, plan: "StepPlan", leading: int) -> tuple:
        """plan_kv, the first `leading` entries being `decode_all` (each takes a block iff its
        last one is full: all of `needs_block`)."""
        live, sched = self.by_id, plan.num_scheduled_tokens
        if not sched and not plan.preempt:
            return 0, self.num_free_blocks
        kv = _kv(live[next(iter(sched or plan.preempt))])
        bs, ref = kv.block_size, kv.ref
        released = Counter()
        for rid in plan.preempt:
            released.update(_request(live[rid]).block_table)
        available = self.num_free_blocks + sum(1 for b, k in released.items() if ref[b] == k)
        needed, reclaimed = len(self.needs_block) if leading else 0, set()
        decoding, needs_block = self.decoding, self.needs_block
        for rid, n in islice(sched.items(), leading, None):
            if n == 1 and rid in decoding:      # one decode token: a new block iff the last is full
                needed += rid in needs_block
                continue
            v = live[rid]
            r = _request(v)
            table = r.block_table
            if table:                # the same arithmetic as blocks_needed
                need = blocks_for(r.num_computed_tokens + n, bs) - len(table)
            else:
                hits = v.cached_blocks()
                need = blocks_for(r.num_computed_tokens + len(hits) * bs + n, bs) - len(hits)
                reclaimed.update(b for b in hits if ref[b] == released[b])
            if need > 0:
                needed += need
        return needed + len(reclaimed), available


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


def leading_decodes(view: SchedulerView, sched: Mapping) -> int:
    """How many entries of `sched` are `view.decode_all`'s, when it begins with exactly them (every
    decode, one token, in running order: a plan built as `dict(view.decode_all)` plus prefill
    chunks); else 0. Two C-level list comparisons instead of a lookup per decode."""
    k = len(view.decode_all)
    if k and len(sched) >= k and list(islice(sched, k)) == list(view.decode_all) and \
            list(islice(sched.values(), k)).count(1) == k:
        return k
    return 0


def validate_plan(view: SchedulerView, plan: StepPlan, policy: str) -> tuple:
    """Check every rule of DESIGN §3; raise ContractViolation on the first broken one.

    Returns (decode_only, leading): decode_only when the plan schedules running decodes only
    (the engine's fast path), else `leading_decodes` of its tokens (0 when it does not begin
    with `decode_all`: the engine then finds its decodes one by one).
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
        leading = leading_decodes(view, sched)    # (int values: `== 1` there is `is 1`)
        decoding = view.decoding       # decoding requests take exactly 1 token: a set lookup each
        for rid, n in islice(sched.items(), leading, None):
            if rid in decoding:
                if n != 1:
                    raise ContractViolation(policy, "decode_one",
                                            f"request {rid} is decoding and must get exactly 1 token, got {n}")
                continue
            v = live[rid]
            r = _request(v)
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
        blocks, free = view._plan_kv(plan, leading)
    total = len(sched) if decode_only else sum(sched.values())
    if total > view.max_num_batched_tokens:
        raise ContractViolation(policy, "token_budget",
                                f"{total} tokens scheduled > "
                                f"max_num_batched_tokens={view.max_num_batched_tokens}")
    if blocks > free:
        raise ContractViolation(policy, "kv_capacity",
                                f"plan needs {blocks} KV blocks but only {free} are free after preemptions")
    return decode_only, 0 if decode_only else leading


def is_decode_only(view: SchedulerView, plan: StepPlan) -> bool:
    """True when the plan only schedules running decodes (no preemption, no rejection)."""
    sched = plan.num_scheduled_tokens
    if plan.preempt or plan.reject or not sched:
        return False
    if len(view.running_ids) == len(view.decoding) and len(sched) == len(view.running_ids) and (
            sched is view.decode_all or tuple(sched) == view.running_ids):
        return True                    # every running request decodes, in running order: the usual plan
    return sched.keys() <= view.decoding
