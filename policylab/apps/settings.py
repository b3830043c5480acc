"""What the layers below the app need from a run's config, made once here from the typed
`RunConfig`: the result files' settings and the tracker's. Below `apps/` nothing reads the
config; it receives these frozen objects."""
from __future__ import annotations

import dataclasses

from policylab.analysis.metrics import json_safe
from policylab.analysis.result_files import ResultSettings
from policylab.analysis.tracking import TrackerSettings
from policylab.cluster.config import POOLS, is_cluster, policy_label, spec_name


def plain_config(run) -> dict | None:
    """The resolved config as plain JSON-ready containers (None when no config was given)."""
    if run is None:
        return None
    if dataclasses.is_dataclass(run):
        return json_safe(dataclasses.asdict(run))
    return json_safe(dict(run))


def result_settings(run) -> ResultSettings:
    """The SLOs, fairness weights, QoE expectations and echoed config of summary.json (defaults without a config)."""
    if run is None:
        return ResultSettings()
    return ResultSettings(slo=run.slo, fairness=run.fairness, qoe=run.qoe, config=plain_config(run))


def tracker_settings(run) -> TrackerSettings:
    """The W&B run's logger settings, tags and config: the policy (per pool under P/D), the trace,
    the user's tags and, for a cluster, the router and the replica count."""
    policy, extra = str(run.policy.name), []
    cluster = getattr(run, "cluster", None)
    if cluster is not None and is_cluster(cluster):     # cluster figures: summary keys cluster/...
        extra += [f"router:{run.router.name}", f"replicas:{cluster.size}"]
        if cluster.disaggregated:                        # the step policy of each P/D pool
            pools = {pool: spec_name(getattr(cluster, f"{pool}_policy")) or policy for pool in POOLS}
            policy = policy_label(policy, pools["prefill"], pools["decode"])
            extra += [f"{pool}_policy:{name}" for pool, name in pools.items()]
    tags = [policy, str(run.trace.name), *map(str, run.logger.tags), *extra]
    return TrackerSettings(logger=run.logger, tags=tuple(dict.fromkeys(tags)), config=plain_config(run),
                           system_stats=run.dataplane.kind == "torch")
