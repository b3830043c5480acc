"""What a cluster replay returns: a `RunResult` over the whole trace (so every metric of a
single replay applies unchanged), plus where each request ran and each replica's own result."""
from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from policylab.core.result import STEP_FIELDS, RunResult, Setting

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


class SummedStats(Mapping):
    """Several replicas' counters of one section, summed when read (live: they keep counting); a
    `Setting` read from the first (every replica has the same)."""

    def __init__(self, parts: list):
        self._parts = parts

    def __getitem__(self, key):
        first = self._parts[0][key]
        return first if isinstance(first, Setting) else sum(p[key] for p in self._parts)

    def __iter__(self):
        return iter(self._parts[0])

    def __len__(self) -> int:
        return len(self._parts[0])


class MergedPrograms:
    """The replicas' tool-call records as one run's: per request (each ran on one replica), and the
    run's counters summed."""

    def __init__(self, parts: list):
        self.per_request = ChainMap(*[p.per_request for p in parts])
        self.tool_tokens = ChainMap(*[p.tool_tokens for p in parts])
        self.stats = SummedStats([p.stats for p in parts])


def merged_sections(parts: list) -> dict:
    """The sections of the replicas' results (`parts`: their `sections` dicts) as one run's: counters
    summed, per-request records joined. Live views: read them when the run is done."""
    out = {}
    for name in dict.fromkeys(k for p in parts for k in p):
        values = [p[name] for p in parts if name in p]
        out[name] = SummedStats(values) if isinstance(values[0], Mapping) else MergedPrograms(values)
    return out


def merged_steps(parts: list) -> dict:
    """Every replica's step columns plus `replica`, in clock order (ties: replica order), as arrays
    (joined as numpy columns: a list of Python floats per column would hold millions of objects)."""
    columns = {k: np.concatenate([np.asarray(p.result.steps[k]) for p in parts]) for k in STEP_FIELDS}
    columns["replica"] = np.repeat(np.array([p.index for p in parts], dtype=np.int64),
                                   [len(p.result.steps["clock"]) for p in parts])
    order = np.argsort(columns["clock"], kind="stable")
    return {k: columns.pop(k)[order] for k in list(columns)}     # (each unsorted column freed once sorted)
