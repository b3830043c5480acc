"""policylab: scheduling policies for LLM serving, replayed on a paged-KV data plane.

The policy author's front door: a policy subclasses `Policy`, reads a `SchedulerView`
(its `waiting`/`running` are `RequestView`s) and returns a `StepPlan`; a plan that breaks
the step contract raises `ContractViolation`. A router (cluster runs) subclasses `Router`,
reads a `ClusterView` (its `replicas` are `ReplicaView`s; `CapacityView`s for a router that
declares `reads_load = False`) and a `RouteRequest`, and returns a replica index. Layers:
`core` → `dataplane`, `traces` → `cluster` → `analysis` → `apps` (see docs/design.md).

The researcher's front door from Python: `replay(policy=..., trace=..., **overrides)` runs
what `python -m policylab run` runs and returns a `Run` (`.summary`, `.requests`, `.steps`,
`.dir`, `.plots`); `compare(runs)` returns the comparison table and writes its report;
`reproduce(NAME)` replays a published result beside the paper's number (docs/reproductions.md).
They live in the app layer and are imported on first use, so `import policylab` stays light.
"""
import sys as _sys

if _sys.argv[:1] == ["-m"]:            # `python -m policylab` is starting (its __main__ ends a stop
    import policylab._startup  # noqa: F401  # signal during the imports in one line)
from policylab.core.contract import ContractViolation, RequestView, SchedulerView, StepPlan
from policylab.core.policy import Policy
from policylab.core.routing import CapacityView, ClusterView, Migration, ReplicaView, RouteRequest, Router, \
    RouteViolation, RunningRequest

LAZY = {"replay": "policylab.apps.python_api", "compare": "policylab.apps.python_api",
        "Run": "policylab.apps.run_object", "reproduce": "policylab.apps.reproduce"}


def __getattr__(name: str):
    """`replay`, `compare`, `Run` and `reproduce` on first use (they import Hydra and the analysis code)."""
    if name in LAZY:
        import importlib
        value = getattr(importlib.import_module(LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'policylab' has no attribute {name!r}")


__all__ = ["replay", "compare", "Run", "reproduce", "Policy", "SchedulerView", "RequestView", "StepPlan", "ContractViolation",
           "Router", "ClusterView", "ReplicaView", "CapacityView", "RouteRequest", "RouteViolation", "Migration",
           "RunningRequest"]
