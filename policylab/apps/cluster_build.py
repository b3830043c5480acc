"""Typed building of a cluster run (`cluster.replicas=N`, or `cluster.prefill_replicas=P
cluster.decode_replicas=D`): one engine per replica, each with its own policy instance (under P/D
its pool's policy: `cluster.prefill_policy`, `cluster.decode_policy`, else `policy`), data plane
(its own hardware) and KV cache, the router plugins and the P/D link."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from omegaconf import OmegaConf

from policylab.apps.config import CONFIG_DIR, RunConfig, pool_policy, typed_dataplane
from policylab.apps.engine_build import engine_of
from policylab.core.features import check_combination, features_of
from policylab.apps.config_checks import check_replicas
from policylab.cluster import Cluster, Replica
from policylab.cluster.config import check_cluster_config
from policylab.cluster.disagg import Disaggregation, prefill_trace
from policylab.cluster.link import LinkModel
from policylab.cluster.migration import LiveMigration
from policylab.core.config import HardwareConfig
from policylab.dataplane import build_dataplane
from policylab.dataplane.sim import ModelShape
from policylab.traces import load_trace


class ClusterConfigError(ValueError):
    """A cluster config that cannot run (printed as one line by the job guard)."""


def build_cluster(cfg: RunConfig, make_policy: Callable[[dict], object], trace=None) -> Cluster:
    """The features of the run are checked against the cluster's topology when it is built (one
    line naming the feature and the topology that do not compose). `make_policy(spec)` builds a fresh step policy from a `_target_` dict for each replica
    (jobs.build_policy); `trace`: the run's trace if already loaded."""
    c = cfg.cluster
    check_cluster_config(c)
    if cfg.engine.clock != "virtual":
        raise ClusterConfigError(f"cluster runs need engine.clock=virtual (got {cfg.engine.clock})")
    trace = load_trace(cfg.trace, seed=cfg.seed) if trace is None else trace
    sessions = getattr(trace, "sessions", None)
    trace = sorted(trace, key=lambda t: t.arrival_time)
    router = build_router(cfg.router, "router")
    features = features_of(trace, cfg.engine, make_policy(cfg.policy), sessions, cfg.speculative.k,
                           cfg.trace.client_timeout) | router_features(router)
    check_combination(features, None, None, "pd" if c.disaggregated else "replicas", cfg.engine)   # before any
    roles = ["prefill"] * c.prefill_replicas + ["decode"] * c.decode_replicas if c.disaggregated \
        else ["colocated"] * c.size
    hardware = [hardware_config(name) for name in c.hardware] or [cfg.hardware] * c.size
    plane = typed_dataplane(cfg.dataplane)       # (a sim plane is cheap to build: its KV size, before N of them)
    check_replicas(cfg, None if plane.kind != "sim" else lambda: max(
        build_dataplane(plane, cfg.model, hw, cfg.seed).num_kv_blocks(cfg.engine.block_size)
        for hw in {h.name: h for h in hardware}.values()))
    front = prefill_trace(trace) if c.disaggregated else trace
    specs = {role: cfg.policy if role == "colocated" else pool_policy(cfg, role) for role in set(roles)}
    replicas = []
    for k, (role, hw) in enumerate(zip(roles, hardware)):
        engine = engine_of(cfg, front if role == "prefill" else trace, role_policy(make_policy, specs[role], role),
                           build_dataplane(typed_dataplane(cfg.dataplane), cfg.model, hw, cfg.seed))
        replicas.append(Replica(k, role, hw.name, engine))
    pd = Disaggregation(build_router(cfg.decode_router, "decode_router"), LinkModel(c.link),
                        ModelShape(cfg.model).kv_bytes_per_token, cfg.seed) if c.disaggregated else None
    migration = LiveMigration(LinkModel(c.link), ModelShape(cfg.model).kv_bytes_per_token,
                              getattr(router, "stop_copy_blocks", 1), getattr(router, "max_stages", 8)) \
        if router_features(router) else None
    return Cluster(trace, replicas, router, pd, sessions=sessions, migration=migration)


def router_features(router) -> set:
    """The features a router brings: live migration, if it rebalances (`rebalance_interval`)."""
    return {"migration"} if getattr(router, "rebalance_interval", None) else set()


def spec_features(spec) -> set:
    """`router_features` of the router a config's `_target_` dict names (none when it names none):
    what a run that builds no cluster refuses."""
    if not spec:
        return set()
    try:
        return router_features(build_router(spec, "router"))
    except ClusterConfigError:           # (a router a one-engine run never builds: not its error)
        return set()


def role_policy(make_policy: Callable[[dict], object], spec: dict, role: str):
    """A fresh policy for a replica of this role; a P/D pool's failure names its config key."""
    try:
        return make_policy(spec)
    except Exception as e:
        if role == "colocated":           # `policy` itself: the job guard reports it as before
            raise
        raise ClusterConfigError(f"cluster.{role}_policy: {e}") from None


def build_router(spec, key: str):
    """The router a `_target_` dict names (`router=NAME`: configs/router/NAME.yaml)."""
    from hydra.utils import instantiate
    if not spec:
        raise ClusterConfigError(f"no {key}: choose one, e.g. {key}=round_robin (configs/router/)")
    try:
        router = instantiate(dict(spec), _convert_="all")
    except Exception as e:
        raise ClusterConfigError(f"cannot build {key} from {dict(spec)}: {e}") from None
    if not callable(getattr(router, "route", None)):
        raise ClusterConfigError(f"{key} {type(router).__name__} has no route(request, view) method")
    return router


def hardware_config(name: str) -> HardwareConfig:
    """configs/hardware/NAME.yaml as a HardwareConfig (cluster.hardware lists names)."""
    path = Path(CONFIG_DIR) / "hardware" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ValueError(f"cluster.hardware: unknown hardware '{name}' (known: {', '.join(known)})")
    return HardwareConfig(**OmegaConf.to_container(OmegaConf.load(path)))
