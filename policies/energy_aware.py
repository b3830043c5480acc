"""energy_aware — chunked prefill that lowers the GPU's SM clock while every request has SLO slack.

Decode is memory-bound: a lower SM clock barely slows it, while the SMs' clocked power falls
with the clock (policylab/dataplane/energy.py; measured decode energy savings of up to a third
at little throughput cost, Ma et al. 2026, arXiv 2605.11999). Prefill is compute-bound and
slows in proportion. So each step, after `Chunked` plans it, the policy sets the clock:

- `low_clock_mhz` (default: the GPU's lowest allowed clock) when every request is well within
  its SLOs: each waiting or prefilling request has used less than `slack` of its TTFT SLO, and
  each decoding request's TPOT so far is below `slack` of its TPOT SLO;
- the maximum clock otherwise, so a request short of time gets full speed at once.

Requests' SLOs are the trace's, else `ttft_slo` / `tpot_slo` (the run's `slo.*`). The policy
needs a settable clock, which the app layer attaches (`attach_clock`) on a data plane with a GPU
power model (`dataplane=sim`, or the real plane timed by one); without one it is `chunked`.
Only the first `scan` waiting requests are looked at (the queue's head has waited longest).
"""
from __future__ import annotations

from policies.chunked import Chunked
from policylab import SchedulerView, StepPlan


class EnergyAware(Chunked):
    properties = ("stall_free", "chunk_budget")

    def __init__(self, name: str | None = None, chunk_size: int = 512, ttft_slo: float = 2.0, tpot_slo: float = 0.2,
                 slack: float = 0.5, low_clock_mhz: float | None = None, scan: int = 16):
        super().__init__(name or "energy_aware", chunk_size)
        if not 0 < slack <= 1:
            raise ValueError(f"energy_aware: slack is the share of an SLO a request may use at the low clock, "
                             f"in (0, 1], got {slack!r}")
        for key, value in (("ttft_slo", ttft_slo), ("tpot_slo", tpot_slo)):
            if not value > 0:
                raise ValueError(f"energy_aware: {key} must be > 0 seconds, got {value!r}")
        self.ttft_slo, self.tpot_slo, self.slack = float(ttft_slo), float(tpot_slo), float(slack)
        self.low_clock_mhz, self.scan = low_clock_mhz, int(scan)
        self.clock = None
        self.low_steps = self.steps = 0

    def attach_clock(self, clock) -> None:
        """The GPU clock this policy sets each step (policylab.dataplane.energy.GpuClock)."""
        self.clock = clock
        low = clock.min_mhz if self.low_clock_mhz is None else float(self.low_clock_mhz)
        clock.set(low)                      # (an out-of-range clock is refused here, before the run)
        clock.set(clock.max_mhz)
        self.low = low

    def schedule(self, view: SchedulerView) -> StepPlan:
        plan = super().schedule(view)
        if self.clock is not None:
            relaxed = self.relaxed(view)
            self.clock.set(self.low if relaxed else self.clock.max_mhz)
            self.low_steps += relaxed
            self.steps += 1
        return plan

    def relaxed(self, view: SchedulerView) -> bool:
        """Every request within `slack` of its SLOs (module doc)."""
        now, limit = view.clock, self.slack
        for v in view.waiting[:self.scan]:
            if now - v.arrival_time > limit * (v.ttft_slo or self.ttft_slo):
                return False
        for v in view.prefilling:
            if now - v.arrival_time > limit * (v.ttft_slo or self.ttft_slo):
                return False
        for v in view.running:
            first, n = v.first_token_time, v.num_output_tokens
            if first is not None and n > 1 and (now - first) / (n - 1) > limit * (v.tpot_slo or self.tpot_slo):
                return False
        return True
