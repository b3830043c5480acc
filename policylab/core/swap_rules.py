"""The contract's rules of swap preemption (`StepPlan.swap`), checked by `validate_plan` with every
other rule (DESIGN §3)."""
from __future__ import annotations

from policylab.core.violation import ContractViolation


def check_swap(view, plan, preempt_set: set, policy: str) -> None:
    """Swap victims are preempted ones, each once, and their computed blocks fit the host tier free
    before this step (blocks that swap-ins of the same step give back are not counted)."""
    if view.num_total_host_blocks == 0:
        raise ContractViolation(policy, "swap_off", "the plan swaps but the engine has no host tier "
                                "(engine.host_kv_blocks=0)")
    if len(set(plan.swap)) != len(plan.swap):
        raise ContractViolation(policy, "unique", f"a request appears twice in the swap list {plan.swap}")
    outside = [rid for rid in plan.swap if rid not in preempt_set]
    if outside:
        raise ContractViolation(policy, "swap_preempted",
                                f"requests {outside} are swapped but not in the preempt list")
    need = sum(view.host_blocks_needed(view.by_id[rid]) for rid in plan.swap)
    if need > view.num_free_host_blocks:
        raise ContractViolation(policy, "host_capacity", f"swapping out {plan.swap} needs {need} host KV "
                                f"blocks but only {view.num_free_host_blocks} are free")
