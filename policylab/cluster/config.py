"""Typed configuration of a cluster run (the `cluster` section): replicas, their hardware, the
prefill/decode split, the step policy of each P/D pool and the KV-transfer link. No Hydra here
(the app layer converts: a pool policy arrives as a plain `_target_` dict, built there)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

POOLS = ("prefill", "decode")        # P/D pools; `cluster.<pool>_policy` is each one's step policy


@dataclass
class LinkConfig:
    """How long moving a request's KV from a prefill to a decode replica takes."""
    kind: str = "bandwidth"         # bandwidth: latency + bytes / bandwidth | profile: a measured send_recv.csv
    bandwidth: float = 50e9         # bytes/s: 400 Gb/s InfiniBand NDR per GPU (cross-node, as Mooncake's RDMA)
    latency: float = 20e-6          # seconds per transfer
    profile: Optional[str] = None   # Vidur network profile, send_recv.csv, or a downloaded name: network/h100_dgx
    devices_per_node: int = 1       # profile rows to use: 1 = across nodes, 2 = within a node (NVLink)


@dataclass
class ClusterConfig:
    replicas: int = 1               # 1: the single engine, exactly as without a cluster
    hardware: list = field(default_factory=list)   # per-replica hardware names ([h100, a100, ...]); []: all `hardware`
    prefill_replicas: int = 0       # P/D disaggregation: P prefill + D decode replicas (replicas = P + D)
    decode_replicas: int = 0
    # P/D: the step policy of each pool, a `_target_` dict as `policy` (the app layer reads
    # `cluster.prefill_policy=chunked` from configs/policy/); None: the run's `policy`
    prefill_policy: Any = None
    decode_policy: Any = None
    link: LinkConfig = field(default_factory=LinkConfig)

    @property
    def disaggregated(self) -> bool:
        return self.prefill_replicas > 0 or self.decode_replicas > 0

    @property
    def size(self) -> int:
        """Replicas in the cluster (P + D when disaggregated)."""
        return self.prefill_replicas + self.decode_replicas if self.disaggregated else self.replicas

    @property
    def is_cluster(self) -> bool:
        return is_cluster(self)


def spec_name(spec) -> str:
    """The name a policy spec (a `_target_` dict, or a bare config name) goes by."""
    if spec is None or isinstance(spec, str):
        return spec
    return str(spec.get("name", spec.get("_target_", "policy")))


def policy_label(policy: str, prefill: Optional[str] = None, decode: Optional[str] = None) -> str:
    """What a run is named by (summary `policy`, run directory, W&B tag): the run's policy, or
    under P/D with a policy per pool `PREFILL+DECODE` (one name when both pools run the same);
    an unset pool (None) runs `policy`."""
    prefill, decode = prefill or policy, decode or policy
    return prefill if prefill == decode else f"{prefill}+{decode}"


def is_cluster(c) -> bool:
    """More than the single engine? (Reads plain fields only: works on a composed config node too.)"""
    return c.replicas > 1 or c.prefill_replicas > 0 or c.decode_replicas > 0


def check_cluster_config(c: ClusterConfig) -> None:
    """Shapes that cannot work fail before the run, naming the field."""
    if c.replicas < 1:
        raise ValueError(f"cluster.replicas must be >= 1, got {c.replicas}")
    if c.disaggregated:
        if c.prefill_replicas < 1 or c.decode_replicas < 1:
            raise ValueError(f"P/D disaggregation needs cluster.prefill_replicas >= 1 and cluster.decode_replicas "
                             f">= 1, got {c.prefill_replicas} and {c.decode_replicas}")
        if c.replicas not in (1, c.size):
            raise ValueError(f"cluster.replicas={c.replicas} but prefill_replicas + decode_replicas = {c.size}: "
                             "leave cluster.replicas unset with P/D")
    for pool in POOLS:
        if getattr(c, f"{pool}_policy") is not None and not c.disaggregated:
            raise ValueError(f"cluster.{pool}_policy is the step policy of the P/D {pool} pool: it needs "
                             "cluster.prefill_replicas and cluster.decode_replicas (colocated replicas run `policy`)")
    if c.hardware and len(c.hardware) != c.size:
        raise ValueError(f"cluster.hardware lists {len(c.hardware)} entries for {c.size} replicas")
    if c.link.kind not in ("bandwidth", "profile"):
        raise ValueError(f"cluster.link.kind must be 'bandwidth' or 'profile', got '{c.link.kind}'")
    if c.link.kind == "bandwidth" and (c.link.bandwidth <= 0 or c.link.latency < 0):
        raise ValueError(f"cluster.link needs bandwidth > 0 and latency >= 0, got {c.link.bandwidth}, {c.link.latency}")
    if c.link.kind == "profile" and not c.link.profile:
        raise ValueError("cluster.link.kind=profile needs cluster.link.profile=PATH/send_recv.csv")
