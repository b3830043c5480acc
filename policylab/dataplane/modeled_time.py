"""`dataplane.step_time=model`: the real plane computes the tokens, a cost model times the step.

A replay on the real plane is timed by its measured step durations (DESIGN §5), so which
requests have arrived when the policy decides, and hence preemptions and batch shapes,
depend on the machine's speed and load. With a modelled step time the virtual clock
advances by the sim's cost of the same batch (roofline of `model` on `hardware`, or
`dataplane.calibration`): the replay is deterministic on any machine while the tokens are
still the real model's. Tests of the real plane use it; so can a researcher who wants
real outputs under a reproducible schedule. It is the default on CPU (`step_time=auto`).
"""
from __future__ import annotations

from policylab.core.batch import Batch, StepResult
from policylab.dataplane.cpu_host import STEP_TIMES  # noqa: F401  (the accepted dataplane.step_time values)

class ModeledStepTime:
    """Delegates everything to `plane`; only `execute`'s duration comes from `cost_model`."""

    def __init__(self, plane, cost_model):
        self.plane, self.cost_model = plane, cost_model

    def __getattr__(self, name):            # vocab_size, num_kv_blocks, allocate_kv, forward, ...
        return getattr(self.plane, name)

    def execute(self, batch: Batch) -> StepResult:
        result = self.plane.execute(batch)
        return StepResult(result.sampled, self.cost_model.step_time(batch), result.accepted)

    def energy_report(self) -> dict | None:
        """The modelled GPU's energy for the steps it timed (policylab.dataplane.energy)."""
        return self.cost_model.energy_report()

    def attach_clock(self, clock) -> None:
        self.cost_model.attach_clock(clock)

    def describe_cost_model(self) -> dict:
        """The cost model that timed the steps (recorded in summary.json); the tokens are the real plane's."""
        return {**self.cost_model.describe_cost_model(), "tokens_from": "real plane"}
