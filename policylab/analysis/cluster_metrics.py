"""Cluster figures of a cluster replay (policylab.cluster), beside the usual metrics of DESIGN §6.

- per request: the replica(s) it ran on, its KV transfer time and decode-side KV wait (P/D);
- per replica: its role and step policy, requests admitted, busy time and utilisation (busy /
  makespan), prefix-cache hit rate (of the prompts it admitted), preemptions, goodput of the
  requests it admitted; under P/D the policy of each pool;
- cluster-wide: load imbalance = max / mean busy time over replicas, and goodput per GPU
  (DistServe's per-GPU goodput: the cluster's goodput / its replicas, one GPU each).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from policylab.analysis.kv_hierarchy import replica_kv_hierarchy
from policylab.cluster.result import PLACEMENT_FIELDS, ClusterResult

PLACEMENT_DTYPES = {"replica": np.int64, "decode_replica": np.int64, "transfer_time": np.float64,
                    "kv_wait": np.float64}


def add_placement(requests: pd.DataFrame, result, start: int = 0, stop: int | None = None) -> pd.DataFrame:
    """The request table (rows `start`..`stop` of the trace) plus where each request ran (a
    cluster replay only)."""
    if not isinstance(result, ClusterResult):
        return requests
    return requests.assign(**{k: np.asarray(result.placement[k][start:stop], dtype=PLACEMENT_DTYPES[k])
                              for k in PLACEMENT_FIELDS})    # (the slice, not the run's lists, converted)


def replica_blocks_per_step(steps: dict, result) -> np.ndarray | None:
    """KV blocks of the replica of each step row (None for a single-engine replay)."""
    if not isinstance(result, ClusterResult) or "replica" not in steps:
        return None
    return np.asarray(result.replica_blocks, dtype=np.float64)[np.asarray(steps["replica"], dtype=np.int64)]


def cluster_summary(requests: pd.DataFrame, steps: pd.DataFrame, result: ClusterResult, makespan: float,
                    goodput: float, distribution: Callable) -> dict:
    """The `cluster` section of summary.json; `distribution` is metrics.distribution (DESIGN §6)."""
    per_replica, busy = {}, []
    for part in result.replicas:
        k = part.index
        mine = steps[steps["replica"] == k]
        admitted = requests[(requests["replica"] == k) | (requests["decode_replica"] == k)]
        front = requests[requests["replica"] == k]
        scheduled = ~np.isnan(front["first_scheduled_time"].to_numpy())
        prompts = front["prompt_tokens"].to_numpy()[scheduled].sum()
        busy_time = float(mine["duration"].sum())
        busy.append(busy_time)
        per_replica[str(k)] = {
            "role": part.role, "policy": part.policy, "hardware": part.hardware, "requests": int(len(admitted)),
            "busy_time": busy_time, "utilization": busy_time / makespan if makespan > 0 else None,
            "prefix_cache_hit_rate": (front["cached_tokens"].to_numpy()[scheduled].sum() / prompts)
            if part.role != "decode" and prompts > 0 else None,
            "preemptions": int(mine["preempted"].sum()),
            "goodput": admitted["slo_met"].sum() / makespan if makespan > 0 else None,
            "steps": int(len(mine)), **replica_kv_hierarchy(part)}
    busy = np.asarray(busy)
    out = {"replicas": per_replica, "num_replicas": len(result.replicas),
           "load_imbalance": float(busy.max() / busy.mean()) if busy.size and busy.mean() > 0 else None,
           "goodput_per_gpu": goodput / len(result.replicas) if goodput is not None else None}
    pools = {part.role: part.policy for part in result.replicas if part.role != "colocated"}
    if pools:                         # P/D: the step policy each pool ran
        out["pool_policies"] = pools
    if (requests["decode_replica"] >= 0).any():
        handed = requests[requests["decode_replica"] >= 0]
        out["transfer_time"] = distribution(handed["transfer_time"].to_numpy())
        out["kv_wait"] = distribution(handed["kv_wait"].to_numpy())
    return out
