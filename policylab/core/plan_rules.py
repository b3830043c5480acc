"""The rules a plan must keep (DESIGN §3), checked against the view's facts before the engine
touches any state: `validate_plan`, and `check_plan` (the same, saying what it found for the engine), with the steady state (every
decode its one token, in running order) checked by its totals and any other plan entry by entry."""
from __future__ import annotations

from itertools import islice

from policylab.core.contract import SchedulerView, StepPlan, _copies, _decode, _kv, _request
from policylab.core.kv.cost import new_blocks
from policylab.core.request import is_decoding
from policylab.core.spec_rules import check_spec_tokens
from policylab.core.swap_rules import check_swap
from policylab.core.violation import ContractViolation


def validate_plan(view: SchedulerView, plan: StepPlan, policy: str = "policy") -> None:
    """Check every rule of DESIGN §3 against the view's facts; raise ContractViolation on the first
    broken one. Pure: reads the plan's values only, changes nothing."""
    check_plan(view, plan, policy)


def check_plan(view: SchedulerView, plan: StepPlan, policy: str = "policy") -> int:
    """`validate_plan`, saying what it found on the way: how many of the plan's first entries give
    every decoding request its one token, in running order, in a plan that neither preempts nor
    rejects (0: not so). The engine commits those on its persistent decode batch without looking
    at them again; when they are the whole plan it is the steady state."""
    if not isinstance(plan, StepPlan):
        raise ContractViolation(policy, "plan_type",
                                f"schedule() must return a StepPlan, got {type(plan).__name__}")
    sched = plan.num_scheduled_tokens
    if len(sched) > view.max_num_seqs:
        raise ContractViolation(policy, "seq_cap",
                                f"{len(sched)} requests scheduled > max_num_seqs={view.max_num_seqs}")
    decode = _decode(view)
    decode_ids = decode.ids
    k = len(decode_ids)
    leading = 0
    if k and len(sched) >= k and not plan.preempt and not plan.reject and not plan.swap:
        first = list(sched)
        del first[k:]                # (its first k keys, without a copy)
        if first == decode_ids and _all_one(islice(sched.values(), k)):
            leading = k
    if leading and leading == len(sched):   # every decode, in running order, each the int 1: only the totals
        total, blocks, free = len(sched), len(decode.full) + decode.cow, view.num_free_blocks
    else:
        total, blocks, free = (leading and _prefill_chunks(view, plan, decode, leading)) or \
            _check_entries(view, plan, policy, leading)
    if plan.spec_tokens:              # k drafts: k more tokens of the budget, the KV of k + 1 tokens
        extra_tokens, extra_blocks = check_spec_tokens(view, plan, policy)
        total, blocks = total + extra_tokens, blocks + extra_blocks
    if total > view.max_num_batched_tokens:
        raise ContractViolation(policy, "token_budget",
                                f"{total} tokens scheduled > "
                                f"max_num_batched_tokens={view.max_num_batched_tokens}")
    if blocks > free:
        raise ContractViolation(policy, "kv_capacity",
                                f"plan needs {blocks} KV blocks but only {free} are free after preemptions")
    return leading


_ONE = 1


def _all_one(values) -> bool:
    """Every one of `values` is the int 1 itself (a loop here costs fewer instructions than
    `any(map(is_not, ...))`, which calls `is_not` for each)."""
    for n in values:
        if n is not _ONE:
            return False
    return True


def _prefill_chunks(view: SchedulerView, plan: StepPlan, decode, leading: int) -> tuple:
    """The usual steps past the steady state: every decode leads and prefill chunks follow (mostly
    one). When every chunk keeps every rule, `_check_entries`' totals (total tokens, blocks needed,
    blocks available) without its passes over a plan's other fields (all empty here); else () and
    `_check_entries` finds the broken rule and says it as for any other plan."""
    sched = plan.num_scheduled_tokens
    rest = (next(reversed(sched.items())),) if leading + 1 == len(sched) else entries_after(sched, leading).items()
    live, decoding, chunks, total = view.by_id, view.decoding, [], leading
    for rid, n in rest:
        v = live.get(rid)
        if type(n) is not int or v is None or rid in decoding:
            return ()
        if not 1 <= n <= v.remaining_tokens:     # (a request that decodes, running or swapped out, has
            return ()                            # 1 left: its one token is a chunk's totals as well)
        r = _request(v)
        chunks.append((r, n))
        total += n
    kv = _kv(v)                  # (one running request's chunk: the tail of its table, as plan_cost finds it)
    needed, available = (new_blocks(r, n, (), kv.block_size), view.num_free_blocks) \
        if len(chunks) == 1 and r.block_table else kv.plan_cost([], chunks)
    return total, needed + len(decode.full) + (_copies(view, plan) if kv.sharing else 0), available


def _check_entries(view: SchedulerView, plan: StepPlan, policy: str, leading: int = 0) -> tuple:
    """validate_plan's rules for any other plan, entry by entry: (total tokens, blocks needed,
    blocks available)."""
    live, sched = view.by_id, plan.num_scheduled_tokens
    rest = entries_after(sched, leading) if leading else sched               # (the leading decodes
    if not set(map(type, rest.values())) <= {int}:                            # are checked)
        rid, n = next((rid, n) for rid, n in rest.items() if type(n) is not int)
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
    if plan.swap:
        check_swap(view, plan, preempt_set, policy)
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
    if not rest.keys() <= live.keys():
        rid = next(rid for rid in rest if rid not in live)
        raise ContractViolation(policy, "unknown_request",
                                f"request {rid} is neither waiting nor running")
    decoding = view.decoding
    all_decodes = rest.keys() <= decoding
    if not (all_decodes and set(rest.values()) <= {1}):    # else every entry is a decode's one token
        for rid, n in rest.items():
            r = _request(live[rid])
            if rid in decoding or is_decoding(r):
                if n != 1:
                    raise ContractViolation(policy, "decode_one",
                                            f"request {rid} is decoding and must get exactly 1 token, got {n}")
            elif not 1 <= n <= live[rid].remaining_tokens:
                raise ContractViolation(policy, "chunk_bounds",
                                        f"request {rid} in prefill got {n} tokens, "
                                        f"allowed 1..{live[rid].remaining_tokens}")
    if all_decodes and not plan.preempt:
        full = _decode(view).full
        blocks = len(full) if len(sched) == len(decoding) else len(full & sched.keys())
        return len(sched), blocks + _copies(view, plan), view.num_free_blocks
    if leading:          # every decode leads, the other entries are prefill chunks
        chunks = [(_request(live[rid]), n) for rid, n in rest.items()]
        needed, available = _kv(live[next(iter(sched))]).plan_cost([], chunks)
        return leading + sum(rest.values()), needed + len(_decode(view).full) + _copies(view, plan), available
    return sum(sched.values()), *view.plan_kv(plan)


def entries_after(sched: dict, leading: int) -> dict:
    """The entries of `sched` after its first `leading`, in order (read from the end: few follow many)."""
    return dict(reversed(list(islice(reversed(sched.items()), len(sched) - leading))))
