"""Base class of scheduling policies (the plugins under `policies/`).

A policy reads a `SchedulerView` and returns a `StepPlan`; it never allocates KV
blocks or mutates requests. The engine validates the plan, then carries it out.
"""
from __future__ import annotations

from policylab.core.contract import SchedulerView, StepPlan


class Policy:
    """Subclass and implement `schedule`. Constructor keywords come from the policy YAML."""

    def __init__(self, name: str | None = None):
        self.name = name or type(self).__name__

    def schedule(self, view: SchedulerView) -> StepPlan:
        raise NotImplementedError

    def on_finished(self, req_view) -> None:
        """Called once when a request finishes or is rejected (optional bookkeeping hook)."""
