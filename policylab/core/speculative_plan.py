"""Giving decodes speculative tokens inside a plan's budgets: the helper spec-aware policies use,
and `FixedSpeculation`, which gives every decode of any policy's plans the same k
(`speculative.k=K` on the command line).

Drafts are added after the policy has planned its step, from what the plan leaves: token budget
(k drafts take k tokens) and free KV blocks (the blocks of k + 1 tokens instead of 1), and never
more than a request may still emit by its `max_tokens` (the only length a policy knows). A
request that cannot get its k gets the largest k that fits.
"""
from __future__ import annotations

from typing import Callable

from policylab.core.contract import SchedulerView, StepPlan
from policylab.core.extensions.speculation import check_spec_tokens


def fill_speculation(view: SchedulerView, plan: StepPlan, k_for: Callable) -> StepPlan:
    """Add `k_for(request view)` drafts to each decode of `plan` (in plan order) while the
    budget and free KV the plan leaves allow; returns the plan (its `spec_tokens` extended)."""
    sched, decoding, live = plan.num_scheduled_tokens, view.decoding, view.by_id
    spec = dict(getattr(plan, "spec_tokens", None) or {})
    planned_tokens, planned_blocks = check_spec_tokens(view, plan, "fill_speculation") if spec else (0, 0)
    tokens_left = view.max_num_batched_tokens - sum(sched.values()) - planned_tokens
    if tokens_left <= 0:
        return plan
    needed, available = view.plan_kv(plan)
    blocks_left = available - needed - planned_blocks
    for rid, n in sched.items():
        if n != 1 or rid not in decoding or rid in spec:
            continue
        v = live[rid]
        k = min(k_for(v), v.max_tokens - v.num_output_tokens - 1, tokens_left)
        base = view.blocks_needed(v, 1)
        while k > 0 and view.blocks_needed(v, 1 + k) - base > blocks_left:
            k -= 1
        if k > 0:
            spec[rid] = k
            tokens_left -= k
            blocks_left -= view.blocks_needed(v, 1 + k) - base
            if tokens_left <= 0:
                break
    plan.spec_tokens = spec
    return plan


class FixedSpeculation:
    """Any policy, with up to `k` speculative tokens for each decode it schedules."""

    def __init__(self, inner, k: int):
        if type(k) is not int or k < 1:
            raise ValueError(f"speculative.k must be an int >= 1 to wrap a policy, got {k!r}")
        name = getattr(inner, "name", type(inner).__name__)
        if "speculation" in getattr(inner, "features", ()):
            raise ValueError(f"speculative.k={k} and policy {name} both choose draft tokens (the policy sizes "
                             "its own): set one of them")
        self.inner, self.k = inner, k
        self.name = f"{name}+spec{k}"
        self.properties = tuple(getattr(inner, "properties", ()))
        self.features = (*getattr(inner, "features", ()), "speculation")

    def schedule(self, view: SchedulerView) -> StepPlan:
        plan = self.inner.schedule(view)
        if not isinstance(plan, StepPlan):
            return plan                      # (the engine reports it: plan_type)
        return fill_speculation(view, plan, lambda v: self.k)

    def on_finished(self, req_view) -> None:
        hook = getattr(self.inner, "on_finished", None)
        if hook is not None:
            hook(req_view)

    def __getattr__(self, name):             # the inner policy's parameters (properties read them)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
