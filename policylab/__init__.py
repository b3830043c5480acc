"""policylab: scheduling policies for LLM serving, replayed on a paged-KV data plane.

The policy author's front door: a policy subclasses `Policy`, reads a `SchedulerView`
(its `waiting`/`running` are `RequestView`s) and returns a `StepPlan`; a plan that breaks
the step contract raises `ContractViolation`. Layers: `core` → `dataplane`, `traces` →
`analysis` → `apps` (see docs/design.md).
"""
from policylab.core.contract import ContractViolation, RequestView, SchedulerView, StepPlan
from policylab.core.policy import Policy

__all__ = ["Policy", "SchedulerView", "RequestView", "StepPlan", "ContractViolation"]
