"""policylab: scheduling policies for LLM serving, replayed on a paged-KV data plane.

The policy author's front door: a policy subclasses `Policy`, reads a `SchedulerView`
(its `waiting`/`running` are `RequestView`s) and returns a `StepPlan`; a plan that breaks
the step contract raises `ContractViolation`. A router (cluster runs) subclasses `Router`,
reads a `ClusterView` (its `replicas` are `ReplicaView`s; `CapacityView`s for a router that
declares `reads_load = False`) and a `RouteRequest`, and returns a replica index. Layers:
`core` → `dataplane`, `traces` → `cluster` → `analysis` → `apps` (see docs/design.md).
"""
import sys as _sys

if _sys.argv[:1] == ["-m"]:            # `python -m policylab` is starting (its __main__ ends a stop
    import policylab._startup  # noqa: F401  # signal during the imports in one line)
from policylab.core.contract import ContractViolation, RequestView, SchedulerView, StepPlan
from policylab.core.policy import Policy
from policylab.core.routing import CapacityView, ClusterView, ReplicaView, RouteRequest, Router, RouteViolation

__all__ = ["Policy", "SchedulerView", "RequestView", "StepPlan", "ContractViolation",
           "Router", "ClusterView", "ReplicaView", "CapacityView", "RouteRequest", "RouteViolation"]
