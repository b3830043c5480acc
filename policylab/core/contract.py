"""The step contract between a scheduling policy and the engine (DESIGN §3).

A policy receives a read-only `SchedulerView` of facts and returns a `StepPlan`. The engine
validates every plan (`policylab.core.plan_rules.validate_plan`) before touching any state; a
broken rule raises `ContractViolation` naming the policy and the rule. Nothing is silently fixed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, AbstractSet, Mapping, Sequence

from policylab.core.request import is_decoding
from policylab.core.violation import ContractViolation  # noqa: F401  (raised here; importable from here)

if TYPE_CHECKING:
    from policylab.core.kv import KVManager
    from policylab.core.request import Request


class RequestView:
    """Read-only window on one live request. Never exposes the true output length.

    Its slots are hidden (their descriptors are taken off the class below): no attribute of a
    view leads to the engine's `Request` or block manager, and no attribute of it can be set.
    `req_id` and `prompt_len`, which never change and are asked most (a prompt length in every
    `remaining_tokens`), are copies of the request's in slots of their own, read at C level.
    """

    __slots__ = ("_r", "_kv", "_id", "_prompt_len")

    def __new__(cls, request: "Request", kv: "KVManager"):   # (no __init__: calling it again on
        self = object.__new__(cls)                                 # a live view cannot rebind it)
        _set_request(self, request)
        _set_kv(self, kv)
        _set_id(self, request.req_id)
        _set_prompt_len(self, request.prompt_len)
        return self

    arrival_time = property(lambda s: _request(s).arrival_time)
    client = property(lambda s: _request(s).client)
    priority = property(lambda s: _request(s).priority)
    ttft_slo = property(lambda s: _request(s).ttft_slo)
    tpot_slo = property(lambda s: _request(s).tpot_slo)
    max_tokens = property(lambda s: _request(s).max_tokens)
    predicted_output_tokens = property(lambda s: _request(s).predicted_output_tokens)
    num_output_tokens = property(lambda s: len(_request(s).output_ids))
    num_tokens = property(lambda s: _request(s).num_tokens)
    num_computed_tokens = property(lambda s: _request(s).num_computed_tokens)
    num_blocks = property(lambda s: len(_request(s).block_table))
    num_preemptions = property(lambda s: _request(s).num_preemptions)
    is_swapped = property(lambda s: _request(s).swapped_blocks > 0,
                          doc="Waiting with its KV on the host tier: scheduling it swaps it back in.")
    num_host_blocks = property(lambda s: _request(s).swapped_blocks)
    first_scheduled_time = property(lambda s: _request(s).first_scheduled_time)
    first_token_time = property(lambda s: _request(s).token_times[0] if _request(s).token_times else None)
    last_token_time = property(lambda s: _request(s).token_times[-1] if _request(s).token_times else None)
    status = property(lambda s: _request(s).status.value)
    is_decode = property(lambda s: is_decoding(_request(s)), doc="Its next step is exactly one decode token.")
    is_prefill = property(lambda s: not is_decoding(_request(s)))
    fork_of = property(lambda s: _request(s).fork_of,
                       doc="A parallel sample of request `fork_of` (None: a trace request itself).")

    def cached_blocks(self) -> tuple:
        """Prefix-cache blocks this request would reuse if scheduled now, from the prompt's start: a
        device block's id, or for a block on a host or disk tier of the prefix cache a negative key
        of its hash (distinct blocks, distinct keys: requests' prefixes compare by these)."""
        return _kv(self).cached_keys(_request(self))

    @property
    def num_cached_tokens(self) -> int:
        """Tokens served from the prefix cache if scheduled now (always leaves one to compute)."""
        kv = _kv(self)
        return len(kv.hits(_request(self))) * kv.block_size

    @property
    def remaining_tokens(self) -> int:
        """Most tokens this request may be given this step (prefill remainder, or 1 for decode)."""
        r = _request(self)
        left = _prompt_len(self) + len(r.output_ids) - r.num_computed_tokens
        if r.block_table:                  # (running: no hit while it holds KV; asked several times a step)
            return left
        beyond = self.num_cached_tokens - r.num_computed_tokens    # (a swapped one's hits are computed
        return left - beyond if beyond > 0 else left                # tokens it has: none beyond)

    def __repr__(self) -> str:
        return (f"RequestView(id={self.req_id}, {self.status}, prompt={self.prompt_len}, "
                f"computed={self.num_computed_tokens}, out={self.num_output_tokens})")


def hide_slot(cls, name: str) -> tuple:
    """(get, set) of a slot whose descriptor is removed from the class: only this module reaches it."""
    descriptor = cls.__dict__[name]
    delattr(cls, name)
    return descriptor.__get__, descriptor.__set__


(request_of, _set_request), (_kv, _set_kv) = hide_slot(RequestView, "_r"), hide_slot(RequestView, "_kv")
(_get_id, _set_id), (_prompt_len, _set_prompt_len) = hide_slot(RequestView, "_id"), \
    hide_slot(RequestView, "_prompt_len")
RequestView.req_id = property(_get_id, doc="The request's id (its index in the trace, or a fork's own).")
RequestView.prompt_len = property(_prompt_len, doc="Tokens in its prompt.")
_request = request_of     # the engine's Request behind a view: for the engine and validate_plan only

_FEW = 8                 # prefilling requests that `SchedulerView.prefilling` finds by set difference
_FACTS = ("clock", "step", "waiting", "running", "decoding", "max_num_batched_tokens", "max_num_seqs",
          "block_size", "num_free_blocks", "num_total_blocks", "by_id", "sampled", "arrived")


class DecodeFacts:
    """What the validator and `decode_tokens` know of the decoding requests: those whose last block
    is full (a live read-only set), their ids in running order (a list: a plan's keys compare to it
    as one list), the plan {each: 1} that `decode_tokens` copies, and `cow`: blocks the
    copy-on-writes of every decode take (forks only, `policylab.core.extensions.forks`). The engine makes one
    when the running or decoding requests change; a list of ids it is given it keeps, uncopied (never
    changed after: the engine's facts share theirs while only the running requests change)."""

    __slots__ = ("full", "ids", "plan", "cow", "running_ids", "prefilling")

    def __init__(self, full: AbstractSet[int], ids, cow: int = 0, running_ids: list | None = None, plan=None):
        self.full, self.cow = full, cow     # (`plan`: {each: 1} in order, to give away)
        self.ids = ids if type(ids) is list else list(ids)
        self.plan = dict.fromkeys(ids, 1) if plan is None else plan
        self.running_ids = running_ids    # every running req_id in running order (None: read off the views)
        self.prefilling = None            # `SchedulerView.prefilling`, once asked

    @classmethod
    def of(cls, running: Sequence, decoding: AbstractSet[int], full: AbstractSet[int] = frozenset(),
           cow: int = 0) -> "DecodeFacts":
        """The facts of a view built outside the engine, from its running views and decoding ids."""
        return cls(full, [v.req_id for v in running if v.req_id in decoding], cow)


class SchedulerView(tuple):
    """Everything a policy may read in one step: facts, and the KV questions a policy asks.

    Read-only (an immutable tuple of its facts): every value is a tuple, a read-only mapping or
    set, or a view, and no attribute leads from it to engine state. The engine validates a plan
    against the view it built, so a policy cannot raise its own limits.

    clock, step          seconds on the replay clock; steps executed so far
    waiting              RequestViews in queue order: preempted requests first (latest preemption
                         first), then arrivals
    running              RequestViews, in the order they started running
    decoding             req_ids of running requests whose next step is one decode token
                         (`decode_tokens()` lists them in running order; `prefilling`: the other
                         running requests, those with a prefill chunk to go)
    max_num_batched_tokens, max_num_seqs     the step's budgets
    block_size, num_free_blocks, num_total_blocks   the KV cache
    by_id                every waiting and running request by req_id
    sampled, arrived     what changed since the previous schedule() call: req_ids the last step
                         gave a token (finished ones included), req_ids that arrived into waiting
    num_free_host_blocks, num_total_host_blocks   the host tier for swap preemption
                         (`StepPlan.swap`; engine.host_kv_blocks, 0: swap is off)
    """

    __slots__ = ()

    def __new__(cls, clock: float, step: int, waiting: Sequence, running: tuple, decoding: AbstractSet[int],
                max_num_batched_tokens: int, max_num_seqs: int, block_size: int, num_free_blocks: int,
                num_total_blocks: int, by_id: Mapping, sampled: Sequence = (), arrived: Sequence = (),
                decode: DecodeFacts | None = None, num_free_host_blocks: int = 0, num_total_host_blocks: int = 0):
        if decode is None:
            decode = DecodeFacts.of(running, decoding)
        return tuple.__new__(cls, (clock, step, waiting, running, decoding, max_num_batched_tokens, max_num_seqs,
                                   block_size, num_free_blocks, num_total_blocks, by_id, sampled, arrived, decode,
                                   num_free_host_blocks, num_total_host_blocks))

    # SchedulerView.from_facts((clock, ..., arrived, decode, num_free_host_blocks, num_total_host_blocks)):
    # every fact in the constructor's order, the DecodeFacts built (the engine's, once a step: at C level)
    from_facts = classmethod(tuple.__new__)

    def replace(self, **changes) -> "SchedulerView":
        """A copy with some facts changed (for tests and what-if questions: the engine keeps its own)."""
        facts = dict(zip(_FACTS, self), num_free_host_blocks=self.num_free_host_blocks,
                     num_total_host_blocks=self.num_total_host_blocks)
        facts.update(changes)
        decode = _decode(self)
        if "running" in changes or "decoding" in changes:     # the decode facts follow them
            decode = DecodeFacts.of(facts["running"], facts["decoding"],
                                    frozenset(decode.full & set(facts["decoding"])), decode.cow)
        return SchedulerView(**facts, decode=decode)

    @property
    def prefilling(self) -> tuple:
        """The running requests that are not decoding (their next step is a prefill chunk), in
        running order."""
        running, decoding = self.running, self.decoding
        if len(decoding) == len(running):
            return ()
        decode = _decode(self)      # (facts belong to one state of running and decoding: the
        if decode.prefilling is None:   # engine's last until either changes; so does the answer)
            ids, k = decode.running_ids or [v.req_id for v in running], len(decode.ids)
            if k == len(decoding) and ids[:k] == decode.ids:    # the decodes first (those started
                decode.prefilling = tuple(running[k:])        # last still prefill): the rest
            elif len(running) - len(decoding) <= _FEW:   # a few: by set difference, put in running order
                decode.prefilling = tuple(map(running.__getitem__, sorted(map(ids.index, set(ids).difference(decoding)))))
            else:
                decode.prefilling = tuple([v for v, rid in zip(running, ids) if rid not in decoding])
        return decode.prefilling

    def decode_tokens(self) -> dict:
        """A new {req_id: 1} for every decoding request, in running order: "every decode gets its
        token", to return as a plan or to extend with prefill chunks."""
        return _decode(self).plan.copy()

    @property
    def decode_blocks_needed(self) -> int:
        """Free blocks that giving every decoding request its token takes (one per full last block)."""
        decode = _decode(self)
        return len(decode.full) + decode.cow

    @property
    def decode_needs_block(self) -> AbstractSet[int]:
        """The decoding requests whose token, asked for alone, takes a free block: `blocks_needed(v, 1)`
        is 1 for these and 0 for every other decode. Those whose last block is full (a live
        read-only set, as `decoding`), and under copy-on-write those that write into a block a fork
        shares; their number can then exceed `decode_blocks_needed`, which copies a shared block
        once for all its writers."""
        decode = _decode(self)
        if not decode.cow:               # no decode writes into a shared block
            return decode.full
        live = self.by_id
        return frozenset([rid for rid in decode.ids if self.blocks_needed(live[rid], 1)])

    def remaining_tokens_after(self, plan: "StepPlan", v: RequestView) -> int:
        """`v.remaining_tokens` if `v` is scheduled after `plan`'s entries. Under
        `engine.publish_on_schedule` (vLLM's way) the prompt blocks those entries compute this step
        are in the prefix cache by then, so a waiting request that shares them has that much less
        to compute (and takes no free block for them: `blocks_needed` is unchanged); otherwise
        `v.remaining_tokens`."""
        r, kv = _request(v), _kv(v)
        sched = plan.num_scheduled_tokens
        if not kv.publishes_on_schedule or not sched or r.block_table or not r.block_hashes:
            return v.remaining_tokens
        live, decoding = self.by_id, self.decoding       # (a decode completes no prompt block)
        entries = [(_request(live[rid]), n) for rid, n in sched.items() if rid not in decoding and rid != v.req_id]
        taken = kv.same_step_hits(entries + [(r, 1)]).get(v.req_id) if entries else None
        if not taken:
            return v.remaining_tokens
        return r.num_tokens - (len(kv.hits(r)) + len(taken)) * kv.block_size

    def blocks_needed(self, v: RequestView, n: int) -> int:
        """Free blocks that giving `n` more tokens to this request consumes (cache hits included)."""
        return _kv(v).blocks_needed(_request(v), n)

    def blocks_freed_by_preempting(self, v: RequestView) -> int:
        """Free blocks that preempting this request gives back (blocks others share stay held)."""
        return _kv(v).freed_by(_request(v))

    def host_blocks_needed(self, v: RequestView) -> int:
        """Host-tier blocks that swapping this running request out takes (its computed blocks)."""
        return -(-v.num_computed_tokens // self.block_size)

    def plan_kv(self, plan: "StepPlan") -> tuple:
        """Exact (blocks needed, blocks available) of a whole plan, its preemptions included.

        A cache hit on a block that nobody holds after the preemptions takes a free block
        (counted once even when several requests hit it). Every id must be in `by_id`.
        """
        sched, live, full = plan.num_scheduled_tokens, self.by_id, _decode(self).full
        if not sched and not plan.preempt:
            return 0, self.num_free_blocks
        kv = _kv(live[next(iter(sched or plan.preempt))])
        decoding = self.decoding
        chunks = [(_request(live[rid]), n) for rid, n in sched.items() if not (n == 1 and rid in decoding)]
        decode_blocks = len(full) if len(chunks) + len(decoding) == len(sched) else \
            sum(1 for rid, n in sched.items() if n == 1 and rid in full)
        needed, available = kv.plan_cost([_request(live[rid]) for rid in plan.preempt], chunks)
        return needed + decode_blocks + _copies(self, plan), available

    def __repr__(self) -> str:
        return (f"SchedulerView(step={self.step}, clock={self.clock}, waiting={len(self.waiting)}, "
                f"running={len(self.running)}, decoding={len(self.decoding)}, free_blocks={self.num_free_blocks})")


try:                                     # (read-only field descriptors, as namedtuple's: C-level where
    from _collections import _tuplegetter   # CPython has them)
except ImportError:
    def _tuplegetter(index: int, doc: str):
        return property(itemgetter(index), doc=doc)
for _i, _name in enumerate(_FACTS):
    setattr(SchedulerView, _name, _tuplegetter(_i, f"the view's `{_name}`"))
_decode = itemgetter(len(_FACTS))        # the view's DecodeFacts
SchedulerView.num_free_host_blocks = _tuplegetter(len(_FACTS) + 1, "free host-tier KV blocks")
SchedulerView.num_total_host_blocks = _tuplegetter(len(_FACTS) + 2, "engine.host_kv_blocks")


@dataclass
class StepPlan:
    """A policy's decision for one step (vLLM's `SchedulerOutput.num_scheduled_tokens`).

    `num_scheduled_tokens` maps req_id -> tokens this step, in the order the batch is
    formed; `preempt` lists running req_ids whose device KV is freed: recomputed later, or,
    for those also in `swap`, copied to the host tier and copied back when next scheduled;
    `reject` maps waiting req_ids to a reason (admission control: reported, never dropped);
    `spec_tokens` maps scheduled decoding req_ids to k >= 0 speculative tokens: the step
    verifies k drafts after the decode's token (k + 1 tokens of budget and KV; see
    docs/speculative-decoding.md).
    """

    num_scheduled_tokens: dict = field(default_factory=dict)
    preempt: list = field(default_factory=list)
    reject: dict = field(default_factory=dict)
    swap: list = field(default_factory=list)
    spec_tokens: dict = field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())


def private_copy(plan, policy: str) -> StepPlan:
    """The plan as plain values, taken once: the engine validates and executes this copy only, so
    a plan object that answers differently when read again changes nothing. A plain StepPlan of a
    dict and lists, rejecting nobody, is its own copy: the only policy code that runs while the
    engine commits a plan is `on_finished` of the requests it rejects."""
    if type(plan) is StepPlan and type(plan.num_scheduled_tokens) is dict and type(plan.preempt) is list \
            and type(plan.swap) is list and not plan.reject:
        return plan      # plain values, and no policy code runs before the engine has committed them
    if not isinstance(plan, StepPlan):
        raise ContractViolation(policy, "plan_type",
                                f"schedule() must return a StepPlan, got {type(plan).__name__}")
    copy = object.__new__(StepPlan)          # (a plain StepPlan, whatever class the policy's is)
    try:
        copy.num_scheduled_tokens, copy.preempt, copy.reject, copy.swap = \
            dict(plan.num_scheduled_tokens), list(plan.preempt), dict(plan.reject), list(getattr(plan, "swap", ()))
        spec = getattr(plan, "spec_tokens", None)
        copy.spec_tokens = dict(spec) if spec else {}
        return copy
    except (TypeError, ValueError) as e:
        raise ContractViolation(policy, "plan_type", f"the plan's fields must be a mapping, a list and a "
                                f"mapping (spec_tokens: a mapping): {e}") from None


def _copies(view: SchedulerView, plan: StepPlan) -> int:
    """Blocks the plan's copy-on-writes take: writes into blocks forks share (0 without forks)."""
    sched, live = plan.num_scheduled_tokens, view.by_id
    if not sched:
        return 0
    kv = _kv(live[next(iter(sched))])
    if not kv.sharing:
        return 0
    return kv.write_copies([(_request(live[rid]), n) for rid, n in sched.items()],
                           [_request(live[rid]) for rid in plan.preempt])
