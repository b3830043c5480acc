"""The invariant harness, extended to a cluster (DESIGN §8 per replica, plus the cluster's own).

`build_cluster` assembles a sim cluster from plain pieces (no Hydra); `check_cluster` replays
it and checks, after every turn of the loop: KV conservation on every replica (the engines
check their own accounting after each step), request conservation across replicas (arrived =
finished + rejected + waiting and running on the replicas + in P/D handoff), no request live
on two replicas at once; and at the end: every request finished or rejected with a reason, no
KV block held anywhere, causality, the P→D handoff ordered in time (prefill end ≤ decode
arrival, TTFT unchanged by the move), and determinism (a second replay is identical).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from policylab.cluster import Cluster, ClusterResult, LinkConfig, Replica
from policylab.cluster.disagg import Disaggregation, prefill_trace
from policylab.cluster.link import LinkModel
from policylab.cluster.migration import LiveMigration
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.core.engine import Engine
from policylab.core.request import Status
from policylab.dataplane.sim import ModelShape, SimDataPlane
from policylab.testing.harness import fingerprint
from policylab.testing.loader import policy_factory
from policylab.testing.properties import InvariantViolation
from policylab.testing.replay import SCENARIO_HARDWARE, scenario_dataplane

EPS = 1e-9


def build_cluster(trace, policy, router_factory, cfg: EngineConfig, replicas: int = 2, prefill: int = 0,
                  decode: int = 0, decode_router_factory=None, hardware: Optional[list] = None,
                  link: LinkConfig = LinkConfig(), seed: int = 0, prefix_block_tokens: int = 32,
                  checked: bool = False, prefill_policy=None, decode_policy=None,
                  model: Optional[ModelConfig] = None, sessions=None, observer=None) -> Cluster:
    """A sim cluster: `replicas` colocated engines, or `prefill` + `decode` ones (P/D); the tiny
    model (unless `model`) at a fixed 4 ms per step unless `hardware` says otherwise (as the
    other scenarios); `sessions`: a SessionPlan over `trace`, replayed in closed loop.
    Every replica runs `policy`, except that under P/D `prefill_policy` / `decode_policy` (any
    spec `policy_factory` takes) give a pool its own. A router that rebalances
    (`rebalance_interval`) migrates over `link`; `observer(cluster)`: called after every turn
    (after the checks when `checked`)."""
    trace = sorted(trace, key=lambda t: t.arrival_time)
    roles = ["prefill"] * prefill + ["decode"] * decode if prefill else ["colocated"] * replicas
    hardware = hardware or [SCENARIO_HARDWARE] * len(roles)    # a fixed 4 ms a step, as every scenario
    specs = {"colocated": policy, "prefill": prefill_policy or policy, "decode": decode_policy or policy}
    factories, model = {role: policy_factory(specs[role]) for role in set(roles)}, model or ModelConfig()
    engine_cfg = dataclasses.replace(cfg, check_invariants=True) if checked else cfg
    built = [Replica(k, role, hw.name, Engine(prefill_trace(trace) if role == "prefill" else trace, factories[role](),
                                              SimDataPlane(model, hw, scenario_dataplane(hw), seed), engine_cfg,
                                              seed=seed, prefix_block_tokens=prefix_block_tokens))
             for k, (role, hw) in enumerate(zip(roles, hardware))]
    pd = Disaggregation((decode_router_factory or router_factory)(), LinkModel(link),
                        ModelShape(model).kv_bytes_per_token, seed) if prefill else None
    router = router_factory()
    migration = LiveMigration(LinkModel(link), ModelShape(model).kv_bytes_per_token,
                              getattr(router, "stop_copy_blocks", 1), getattr(router, "max_stages", 8)) \
        if getattr(router, "rebalance_interval", None) else None
    watch = (lambda c: (check_turn(c), observer(c))) if checked and observer else check_turn if checked else observer
    return Cluster(trace, built, router, pd, observer=watch, sessions=sessions, migration=migration)


def check_turn(cluster: Cluster) -> None:
    """The cross-replica invariants, checked after every turn of the cluster's loop."""
    live = {}
    for rep in cluster.replicas:
        for r in (*rep.engine.waiting, *rep.engine.running):
            if r.req_id in live:
                raise InvariantViolation("one_replica", f"request {r.req_id} is live on replicas "
                                         f"{live[r.req_id]} and {rep.index} at once", cluster.router_name)
            live[r.req_id] = rep.index
    transit = set() if cluster.pd is None else cluster.pd.in_transit
    if cluster.migration is not None:             # (in its stop-and-copy: in no replica's batch or queue)
        transit = transit | {rid for rid, f in cluster.migration.flights.items() if "stop" in f.log}
    arrived = [r for r in cluster.requests if r is not None]      # (replica by replica: not a prefix)
    done = sum(1 for r in arrived if r.status in (Status.FINISHED, Status.REJECTED) and r.req_id not in transit)
    if len(arrived) != done + len(live) + len(transit):
        raise InvariantViolation("request_conservation", f"{len(arrived)} arrived != {done} done + "
                                 f"{len(live)} live + {len(transit)} in handoff", cluster.router_name)


def check_cluster(make_cluster) -> ClusterResult:
    """Replay `make_cluster()` (a fresh, checked cluster each call) twice; raise InvariantViolation
    on the first broken invariant; return the result."""
    cluster = make_cluster()
    result = cluster.run()
    if result.partial:
        if "InvariantViolation" in result.error or "ContractViolation" in result.error:
            raise InvariantViolation("cluster", result.error, cluster.router_name)
        raise InvariantViolation("liveness", f"cluster run ended early: {result.error}", cluster.router_name)
    _check_drained(cluster, result)
    if fingerprint(make_cluster().run()) != fingerprint(result):
        raise InvariantViolation("determinism", "two cluster replays with the same seed differ", cluster.router_name)
    return result


def _check_drained(cluster: Cluster, result: ClusterResult) -> None:
    name = cluster.router_name
    for rep in cluster.replicas:
        kv = rep.engine.kv
        if kv.num_free != kv.num_blocks or any(kv.refs):
            raise InvariantViolation("kv_leak", f"replica {rep.index}: {kv.num_blocks - kv.num_free} blocks held "
                                     "after the drain", name)
    for i, (t, r) in enumerate(zip(result.trace, result.requests)):
        if r is None or r.status not in (Status.FINISHED, Status.REJECTED):
            raise InvariantViolation("request_conservation", f"request {i} ended {r and r.status}", name)
        if r.status is Status.REJECTED:
            if not r.reject_reason:
                raise InvariantViolation("reject_reason", f"request {i} rejected without a reason", name)
            continue
        times = [t.arrival_time, r.first_scheduled_time, r.token_times[0], r.finish_time]
        if any(b < a - EPS for a, b in zip(times, times[1:])):
            raise InvariantViolation("causality", f"request {i}: arrival, first scheduled, first token, "
                                     f"finish = {times}", name)
        d = result.placement["decode_replica"][i]
        if d >= 0:
            p = cluster.replicas[result.placement["replica"][i]].engine.requests[i]
            moved = p.finish_time + result.placement["kv_wait"][i] + result.placement["transfer_time"][i]
            if not (p.finish_time <= moved + EPS and p.token_times[0] == r.token_times[0]
                    and cluster.replicas[d].engine.requests[i] is r and len(r.token_times) > 1
                    and r.token_times[1] >= moved - EPS):
                raise InvariantViolation("handoff_order", f"request {i}: prefill ended {p.finish_time}, KV arrived "
                                         f"{moved}, tokens at {r.token_times[:2]}", name)
