"""The engine's liveness rule (DESIGN §3): a preempt/requeue livelock ends the run.

A policy that preempts and readmits the same requests forever would keep a replay running
with no output; after `max_stall_steps` consecutive steps that gave no request a token and
finished none, the run ends with a ContractViolation naming the policy and rule `liveness`.
"""
from __future__ import annotations

from policylab.core.contract import ContractViolation


class Liveness:
    def __init__(self, max_stall_steps: int, policy: str):
        self.max_stall_steps, self.policy = max_stall_steps, policy
        self.stalled = 0              # consecutive steps with no output token and no request done

    def check(self, progressed: bool) -> None:
        """A step was committed (`progressed`: it rejected a request); raise on a livelock."""
        self.stalled = 0 if progressed else self.stalled + 1
        if self.stalled > self.max_stall_steps:
            raise ContractViolation(self.policy, "liveness",
                                    f"{self.max_stall_steps} consecutive steps produced no output token "
                                    "and finished no request (preempt/requeue livelock?)")
