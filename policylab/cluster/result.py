"""What a cluster replay returns: a `RunResult` over the whole trace (so every metric of a
single replay applies unchanged), plus where each request ran and each replica's own result."""
from __future__ import annotations

from dataclasses import dataclass, field

from policylab.core.result import RunResult

PLACEMENT_FIELDS = ("replica", "decode_replica", "transfer_time", "kv_wait")


@dataclass
class ReplicaResult:
    index: int
    role: str                        # colocated | prefill | decode
    hardware: str
    result: RunResult                # this replica's engine: its requests (others None) and steps
    policy: str = ""                 # the step policy its engine ran (under P/D: its pool's)


@dataclass
class ClusterResult(RunResult):
    """`requests[i]` is request i where it ended (its decode replica under P/D); `steps` holds every
    replica's steps with a `replica` column, sorted by clock; `placement` has one list per
    PLACEMENT_FIELDS entry, indexed by request: the replica that admitted it (its prefill replica
    under P/D), its decode replica (-1: none), its KV transfer time and its wait for decode-side
    KV blocks (NaN without P/D)."""
    router: str = ""
    replicas: list = field(default_factory=list)       # ReplicaResult, by index
    placement: dict = field(default_factory=dict)

    @property
    def replica_blocks(self) -> list:
        return [r.result.num_blocks for r in self.replicas]
