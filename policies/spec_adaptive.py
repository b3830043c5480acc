"""spec_adaptive — vLLM v1's scheduler plus speculative tokens sized to the load.

Speculation trades compute for latency: verifying k drafts makes a decode's step compute k + 1
tokens. While the step is memory-bound (few tokens: streaming the weights dominates) the extra
tokens are nearly free and every accepted draft is a token gained; in a large batch the step is
compute-bound, each draft costs its share of the step and rejected drafts are waste. After vLLM
v1's plan (policies/vllm_v1.py) with B decodes and P other tokens, every decode gets the k in
0..k_max that maximises decode tokens per unit of step time:

    gain(k) / cost(k),   gain(k) = (1 − alpha^(k+1)) / (1 − alpha)      (expected tokens, geometric)
                         cost(k) = time(P + B(k+1)) / time(P + B) + k · draft_cost
                         time(T) = (1 + (T / knee_tokens)^3)^(1/3)     (the roofline's smooth max)

`knee_tokens` is where a step turns compute-bound: peak FLOP/s × flops_efficiency over memory
bandwidth × bw_efficiency for a dense 16-bit model (H100: ~220 tokens; configs/hardware/).
`draft_cost` is a draft token's cost relative to a target step (0 for n-gram lookup). alpha is
the acceptance measured on the run so far (accepted drafts are successes, the first rejected one
a failure: the estimate of a geometric rate), starting from `prior_acceptance` worth
`prior_trials` draws. Low load: small B, cost ~1, k_max drafts. High load: k falls to 0 and the
policy is vllm_v1. The token budget, free KV and `max_tokens` cap k as for any plan
(policylab.core.speculative_plan.fill_speculation).
"""
from __future__ import annotations

from policylab import SchedulerView, StepPlan
from policylab.core.speculative_plan import fill_speculation
from policies.vllm_v1 import VllmV1


def step_time(tokens: float, knee: float) -> float:
    """A step's time relative to a 1-token one: flat while memory-bound, linear past the knee."""
    return (1.0 + (tokens / knee) ** 3) ** (1 / 3)


def expected_tokens(k: int, alpha: float) -> float:
    """Tokens one verification of k drafts emits on average (geometric acceptance)."""
    return k + 1.0 if alpha >= 1 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class SpecAdaptive(VllmV1):
    features = ("speculation",)
    def __init__(self, name: str | None = None, k_max: int = 4, knee_tokens: int = 224, draft_cost: float = 0.0,
                 prior_acceptance: float = 0.6, prior_trials: int = 8, **vllm_v1):
        super().__init__(name or "spec_adaptive", **vllm_v1)
        for knob, value in (("k_max", k_max), ("knee_tokens", knee_tokens), ("prior_trials", prior_trials)):
            if type(value) is not int or value < (0 if knob == "k_max" else 1):
                raise ValueError(f"{self.name}: {knob} must be an int >= {0 if knob == 'k_max' else 1}, got {value!r}")
        if not isinstance(draft_cost, (int, float)) or isinstance(draft_cost, bool) or not 0 <= draft_cost < 10:
            raise ValueError(f"{self.name}: draft_cost must be a number in [0, 10), got {draft_cost!r}")
        if not isinstance(prior_acceptance, (int, float)) or isinstance(prior_acceptance, bool) \
                or not 0 <= prior_acceptance <= 1:
            raise ValueError(f"{self.name}: prior_acceptance must be a number in [0, 1], got {prior_acceptance!r}")
        self.k_max, self.knee, self.draft_cost = k_max, knee_tokens, draft_cost
        self.prior_acceptance, self.prior_trials = prior_acceptance, prior_trials
        self.successes = self.failures = 0
        self._given: dict = {}           # req_id -> (k, its output tokens when given k drafts)
        self._best = (None, 0)           # best_k's last (arguments and counts, answer)

    @property
    def acceptance(self) -> float:
        """Measured per-draft acceptance, shrunk toward the prior by `prior_trials` draws."""
        prior = self.prior_acceptance * self.prior_trials
        return (self.successes + prior) / (self.successes + self.failures + self.prior_trials)

    def best_k(self, decodes: int, other_tokens: int) -> int:
        """The k with the most decode tokens per unit of step time (the smallest on a tie)."""
        key = (decodes, other_tokens, self.successes, self.failures, self.k_max, self.knee, self.draft_cost,
               self.prior_acceptance, self.prior_trials)
        if key == self._best[0]:         # (under a steady load: the last step's answer)
            return self._best[1]
        alpha, base = self.acceptance, step_time(other_tokens + decodes, self.knee)
        rates = [expected_tokens(k, alpha) / (step_time(other_tokens + decodes * (k + 1), self.knee) / base
                                              + k * self.draft_cost) for k in range(self.k_max + 1)]
        best = max(range(len(rates)), key=lambda k: (rates[k] - 1e-9 * k))
        self._best = (key, best)
        return best

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
        decodes = self.planned_decodes(view, plan)
        if not decodes or not self.k_max:
            return plan
        k = self.best_k(decodes, 0 if decodes == len(plan.num_scheduled_tokens) else plan.total_tokens - decodes)
        if k <= 0:
            return plan
        plan = fill_speculation(view, plan, lambda v: k)
        self._given.update((rid, (n, live[rid].num_output_tokens)) for rid, n in plan.spec_tokens.items())
        return plan

    def on_finished(self, req_view) -> None:
        if req_view.req_id in self._given:
            self._observe(req_view)
        super().on_finished(req_view)
