"""spec_adaptive — vLLM v1's scheduler plus speculative tokens sized to the load.

Speculation trades compute for latency: verifying k drafts makes a decode's step compute k + 1
tokens. While the step is memory-bound (few tokens: the weights' streaming dominates) those
extra tokens are nearly free and every accepted draft is a token gained; once the batch is large
the step is compute-bound, each draft costs its share of the step and rejected drafts are pure
waste, and the drafts also take budget that prefill chunks would use. So after vLLM v1's plan
(policies/vllm_v1.py), each decode gets

    k = min(k_max, (token_target − tokens the plan already has) // decodes, k_accept)

where `token_target` is the step size up to which extra tokens are ~free (around the roofline's
knee: ~200 tokens for a 7-8B model on an H100) and `k_accept` the largest k whose last draft is
still used with probability >= `min_use`: alpha^k >= min_use for the acceptance alpha measured on
the run so far (each verification: accepted drafts are successes, the first rejected one a
failure, the maximum-likelihood estimate of a geometric rate; `prior_acceptance` before any).
Low load: small batches, k_max drafts. High load: the budget fills with prefill and decodes, k
falls to 0 and the policy is vllm_v1. KV and `max_tokens` caps as any plan
(policylab.core.speculative_plan.fill_speculation).
"""
from __future__ import annotations

import math

from policylab import SchedulerView, StepPlan
from policylab.core.speculative_plan import fill_speculation
from policies.vllm_v1 import VllmV1


class SpecAdaptive(VllmV1):
    def __init__(self, name: str | None = None, k_max: int = 4, token_target: int = 192, min_use: float = 0.3,
                 prior_acceptance: float = 0.6, **vllm_v1):
        super().__init__(name or "spec_adaptive", **vllm_v1)
        if type(k_max) is not int or k_max < 0:
            raise ValueError(f"{self.name}: k_max must be an int >= 0, got {k_max!r}")
        if type(token_target) is not int or token_target < 1:
            raise ValueError(f"{self.name}: token_target must be an int >= 1, got {token_target!r}")
        for knob, value in (("min_use", min_use), ("prior_acceptance", prior_acceptance)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < 1:
                raise ValueError(f"{self.name}: {knob} must be a number in (0, 1), got {value!r}")
        self.k_max, self.token_target, self.min_use = k_max, token_target, min_use
        self.prior_acceptance = prior_acceptance
        self.successes = self.failures = 0
        self._given: dict = {}           # req_id -> (k, its output tokens when given k drafts)

    @property
    def acceptance(self) -> float:
        """Measured per-draft acceptance (the prior until a verification was seen)."""
        trials = self.successes + self.failures
        return self.successes / trials if trials else self.prior_acceptance

    def k_accept(self) -> int:
        alpha = self.acceptance
        if alpha <= 0:
            return 0
        if alpha >= 1:
            return self.k_max
        return min(self.k_max, int(math.log(self.min_use) / math.log(alpha)))

    def _observe(self, v) -> None:
        k, before = self._given.pop(v.req_id)
        accepted = v.num_output_tokens - before - 1
        if accepted < 0:
            return                           # (preempted: it ran no verification)
        self.successes += min(accepted, k)
        self.failures += accepted < k

    def schedule(self, view: SchedulerView) -> StepPlan:
        live = view.by_id
        for rid in [rid for rid in self._given if rid in live]:
            self._observe(live[rid])
        plan = super().schedule(view)
        decodes = sum(1 for rid, n in plan.num_scheduled_tokens.items() if n == 1 and rid in view.decoding)
        if not decodes or not self.k_max:
            return plan
        k = min(self.k_max, (self.token_target - plan.total_tokens) // decodes, self.k_accept())
        if k <= 0:
            return plan
        plan = fill_speculation(view, plan, lambda v: k)
        self._given.update((rid, (n, live[rid].num_output_tokens)) for rid, n in plan.spec_tokens.items())
        return plan

    def on_finished(self, req_view) -> None:
        if req_view.req_id in self._given:
            self._observe(req_view)
        super().on_finished(req_view)
