"""The error a plan that breaks the contract raises: its own module, so that the modules holding
the contract's rules (core.contract, core.spec_rules) share it without importing each other."""
from __future__ import annotations


class ContractViolation(Exception):
    """A plan broke a rule of the contract; carries the policy and the rule names."""

    def __init__(self, policy: str, rule: str, detail: str):
        self.policy, self.rule, self.detail = policy, rule, detail
        self.step = self.time = None
        super().__init__(f"policy '{policy}' broke rule '{rule}': {detail}")

    def locate(self, step: int, time: float) -> None:
        """Name the engine step whose plan broke the rule (once; the message then ends with it)."""
        if self.step is None:
            self.step, self.time = step, time
            self.args = (f"{self.args[0]} (at step {step}, t={time:.6g} s)",)
