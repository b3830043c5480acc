"""A serving engine that schedules one step ahead (vLLM's async scheduling), as an extension.

vLLM's engine plans step k+1 while step k runs on the GPU, so a request that arrives during step
k is first seen when step k+2 is planned. A data plane modelling such an engine declares
`Capability.SCHEDULES_AHEAD`; this extension then admits, while requests run, only what arrived
by the start of the step that just ran. An idle engine admits at once (it plans nothing ahead).
"""
from __future__ import annotations

from policylab.core.extension import Extension


class AsyncScheduling(Extension):
    name = "async_scheduling"

    def admission_horizon(self, now: float) -> float:
        """The latest arrival time the step about to be planned sees."""
        return self.ops.step_start if self.ops.num_running else now
