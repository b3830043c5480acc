"""slo_aware — deadline-driven scheduling with admission control (DESIGN §7).

Rule: each request has TTFT/TPOT targets (the trace's `ttft_slo`/`tpot_slo`, else this
policy's `ttft_slo`/`tpot_slo`) and a slack = deadline − now − estimated remaining work:
  before its first token: deadline arrival + TTFT, work = its remaining prefill;
  after it: deadline first_token + (expected output − 1)·TPOT, work = remaining decode
  steps (+ any recompute), expected output = predicted_output_tokens, else
  min(max_tokens, default_output_tokens) — never the true output length.
Least slack goes first: running requests are served in slack order (preemption victims
come from the tail: the most slack), waiting ones are admitted in slack order. Batching is
`chunked` (every decode gets its token first), and decodes are kept within their TPOT
deadline: the prefill tokens of a step are capped so the step ends before the tightest
running decode's pace deadline first_token + n_out·TPOT (at least one block is always
allowed, so prefills cannot starve).
Admission control: a request that cannot meet its TTFT even if started now (slack < 0
before its first token) is late. `late_policy: serve` serves it after every on-time
request (FCFS among late ones); `late_policy: reject` rejects it with a reason
(StepPlan.reject: reported, never dropped).
Costs: seconds per prefill token and per step, from `prefill_token_cost` and
`decode_step_cost`, refined (`learn_costs`) from observed step durations (view.clock
deltas between consecutive executed steps; EMA, weight `learning_rate`).
Sources: earliest-deadline / least-laxity-first scheduling (Liu & Layland, JACM 1973;
Mok, MIT 1983); TTFT/TPOT SLOs and attainment as in Zhong et al., "DistServe", OSDI'24;
per-token pace deadlines as in Liu et al., "Andes" (2024); Sarathi-Serve's token budget.
"""
from __future__ import annotations

from operator import countOf

from policylab import RequestView, SchedulerView, StepPlan
from policies.chunked import Chunked

LATE_POLICIES = ("serve", "reject")


class SloAware(Chunked):
    def __init__(self, name: str | None = None, ttft_slo: float = 2.0, tpot_slo: float = 0.2,
                 late_policy: str = "serve", chunk_size: int | None = 512,
                 max_partial_prefills: int = 1, prefill_token_cost: float = 3e-5,
                 decode_step_cost: float = 0.015, learn_costs: bool = True,
                 learning_rate: float = 0.2, default_output_tokens: int = 256):
        super().__init__(name or "slo_aware", chunk_size, max_partial_prefills)
        if late_policy not in LATE_POLICIES:
            raise ValueError(f"{self.name}: late_policy must be one of {LATE_POLICIES}, got {late_policy!r}")
        for key, value in (("ttft_slo", ttft_slo), ("tpot_slo", tpot_slo),
                           ("prefill_token_cost", prefill_token_cost),
                           ("decode_step_cost", decode_step_cost), ("learning_rate", learning_rate)):
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{self.name}: {key} must be a number > 0, got {value!r}")
        if learning_rate > 1:
            raise ValueError(f"{self.name}: learning_rate must be in (0, 1], got {learning_rate!r}")
        self.ttft_slo, self.tpot_slo, self.late_policy = float(ttft_slo), float(tpot_slo), late_policy
        self.prefill_token_cost, self.decode_step_cost = float(prefill_token_cost), float(decode_step_cost)
        self.learn_costs, self.learning_rate = learn_costs, float(learning_rate)
        self.default_output_tokens = default_output_tokens
        self._slack: dict = {}  # req_id -> slack at this step's clock (`_now`), filled on demand
        self._now = 0.0
        self._last = None       # (clock, step, prefill tokens, live requests) of the last plan
        self._departed = 0      # requests finished or rejected since the last plan

    # ------------------------------------------------------------- estimates
    def slos(self, v: RequestView) -> tuple:
        return (self.ttft_slo if v.ttft_slo is None else v.ttft_slo,
                self.tpot_slo if v.tpot_slo is None else v.tpot_slo)

    def slack(self, v: RequestView, now: float) -> float:
        first = v.first_token_time
        if first is None:
            ttft = self.ttft_slo if v.ttft_slo is None else v.ttft_slo
            return (v.arrival_time + ttft - now - self.prefill_token_cost * v.remaining_tokens
                    - self.decode_step_cost)
        tpot = self.tpot_slo if v.tpot_slo is None else v.tpot_slo
        done, predicted = v.num_output_tokens, v.predicted_output_tokens
        expected = predicted if predicted is not None else min(v.max_tokens, self.default_output_tokens)
        expected = max(expected, done + 1)
        work = (expected - done) * self.decode_step_cost
        if not v.is_decode:                # preempted: its prompt and outputs are recomputed first
            work += self.prefill_token_cost * v.remaining_tokens
        return first + (expected - 1) * tpot - now - work

    def _learn(self, view: SchedulerView) -> None:
        """Update cost estimates from the last step's duration (skipped if an idle gap may hide in it)."""
        last, self._last = self._last, None
        if last is None or view.step != last[1] + 1:
            return
        if self._departed >= last[3]:
            return                        # everything drained: the clock may have idled since
        duration, prefill_tokens, rate = view.clock - last[0], last[2], self.learning_rate
        if prefill_tokens == 0:
            self.decode_step_cost += rate * (duration - self.decode_step_cost)
        else:
            per_token = max(duration - self.decode_step_cost, 0.0) / prefill_tokens
            self.prefill_token_cost += rate * (max(per_token, 1e-9) - self.prefill_token_cost)
        self.decode_step_cost = max(self.decode_step_cost, 1e-6)

    # ----------------------------------------------------------------- hooks
    def schedule(self, view: SchedulerView) -> StepPlan:
        if self.learn_costs:
            self._learn(view)
        self._now, self._slack = view.clock, {}      # slack is computed only where an order needs it
        plan = super().schedule(view)
        if self.learn_costs:            # chunks of more than one token are prefill (decodes get 1)
            tokens = plan.num_scheduled_tokens.values()
            self._last = (view.clock, view.step, sum(tokens) - countOf(tokens, 1),
                          len(view.running) + len(view.waiting))
            self._departed = 0
        return plan

    def on_finished(self, v: RequestView) -> None:
        self._departed += 1              # requests live at the last plan that left since

    def _slack_of(self, v: RequestView) -> float:
        slack = self._slack.get(v.req_id)
        if slack is None:
            slack = self._slack[v.req_id] = self.slack(v, self._now)
        return slack

    def _late(self, v: RequestView) -> bool:
        return v.first_token_time is None and self._slack_of(v) < 0

    def _slack_key(self, v: RequestView) -> tuple:
        return self._slack_of(v), v.arrival_time, v.req_id

    def running_order(self, view: SchedulerView, running: list) -> list:
        return sorted(running, key=self._slack_key)

    def rejections(self, view: SchedulerView) -> dict:
        if self.late_policy != "reject":
            return {}
        out = {}
        for v in view.waiting:
            if self._late(v) and v.num_output_tokens == 0:
                ttft, _ = self.slos(v)
                out[v.req_id] = (f"cannot meet its TTFT SLO of {ttft:.3g}s: estimated first token "
                                 f"{ttft - self._slack[v.req_id]:.3g}s after arrival")
        return out

    def admission_order(self, view: SchedulerView) -> list:
        on_time = sorted((v for v in view.waiting if not self._late(v)), key=self._slack_key)
        return on_time + [v for v in view.waiting if self._late(v)]

    def prefill_cap(self, view: SchedulerView, budget: int) -> int:
        """Prefill tokens that keep the tightest running decode on its TPOT pace."""
        now, room, default, by_id = view.clock, None, self.tpot_slo, view.by_id
        for rid in view.decoding:
            v = by_id[rid]
            tpot = v.tpot_slo
            left = v.first_token_time + v.num_output_tokens * (default if tpot is None else tpot)
            room = left if room is None else min(room, left)
        if room is None:
            return budget
        room -= now + self.decode_step_cost
        return max(min(budget, int(room / self.prefill_token_cost)), min(budget, view.block_size))
