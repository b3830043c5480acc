"""Live migration between replicas (policylab.cluster.migration): each stage and the stop-and-copy
take the link model's time for their blocks, computed here by hand; the request keeps decoding on
the source during the stages and decodes nowhere during the stop-and-copy; KV is conserved on
every replica at every turn (the source's blocks freed exactly at the commit); a request is never
live on two replicas; a migrated request generates the very tokens of an unmigrated run on the
torch plane; and what migration cannot serve is refused in one line."""
from __future__ import annotations

from collections import Counter

import pytest

from policylab import Migration, Router
from policylab.cluster import LinkConfig
from policylab.core.config import EngineConfig
from policylab.core.features import check_combination, composes
from policylab.core.kv import blocks_for
from policylab.core.request import Status, TraceRequest
from policylab.core.routing import RouteViolation
from policylab.testing.cluster import build_cluster

pytestmark = pytest.mark.timeout(120)

CFG = EngineConfig(num_blocks=64, block_size=16, max_num_batched_tokens=512, max_num_seqs=8)
BYTES_PER_TOKEN = 2048                     # the tiny model's KV (ModelShape(ModelConfig()))
SLOW_LINK = LinkConfig(bandwidth=4e6, latency=1e-3)     # one 16-token block: 1 ms + 8.2 ms


class Scripted(Router):
    """Routes request i to replica `placement[i]`; once request `move` has decoded `after` tokens
    on its replica, migrates it to the other one (or asks the `bad` migration instead)."""

    def __init__(self, placement: dict, move: int, after: int = 4, interval: float = 0.01, bad=None):
        super().__init__("scripted")
        self.placement, self.move, self.after, self.bad = placement, move, after, bad
        self.rebalance_interval, self.asked = interval, False

    def route(self, request, view) -> int:
        return self.placement.get(request.req_id, 0)

    def rebalance(self, view) -> list:
        if self.asked:
            return []
        for replica in view.replicas:
            for q in replica.running_requests:
                if q.req_id == self.move and q.decoding and q.num_tokens >= self.after:
                    self.asked = True
                    return [self.bad or Migration(q.req_id, replica.index, 1 - replica.index)]
        return []


def held_blocks_check(seen: list):
    """An observer: on every replica, every block's reference count is exactly what the request
    tables (running, waiting, a request in its stop-and-copy) and the moves' reservations hold;
    no request is live on two replicas."""
    def check(cluster) -> None:
        flights = cluster.migration.flights
        live = Counter()
        for rep in cluster.replicas:
            e = rep.engine
            held = Counter(b for r in (*e.running, *e.waiting) for b in r.block_table)
            live.update(r.req_id for r in (*e.running, *e.waiting))
            for f in flights.values():
                if f.source == rep.index and "stop" in f.log:      # out of every batch, its blocks kept
                    held.update(e.requests[f.req_id].block_table)
                if f.destination == rep.index:
                    held.update(f.table)
            refs = e.kv.refs
            assert all(refs[b] == held.get(b, 0) for b in range(e.kv.num_blocks)), f"replica {rep.index}"
        assert not [rid for rid, n in live.items() if n > 1]
        seen.append({rid: "stop" in f.log for rid, f in flights.items()})
    return check


def long_trace():
    """Request 0 decodes long on replica 0; two short ones keep replica 1 busy for a while."""
    return [TraceRequest(0.0, 70, 120), TraceRequest(0.001, 40, 10), TraceRequest(0.002, 30, 12)]


def test_stages_and_the_stop_and_copy_take_the_link_models_time_for_their_blocks():
    seen: list = []
    cluster = build_cluster(long_trace(), "chunked", lambda: Scripted({0: 0, 1: 1, 2: 1}, move=0, after=80),
                            CFG, link=SLOW_LINK, observer=held_blocks_check(seen))
    result = cluster.run()
    assert result.status == "complete", result.error
    assert cluster.migration.stats["committed"] == 1
    move = cluster.migration.moves[0]
    per_block = SLOW_LINK.latency, 16 * BYTES_PER_TOKEN / SLOW_LINK.bandwidth
    stages = move["stage_log"]
    assert len(stages) >= 2                             # it kept decoding: more blocks to copy after the first
    r = result.requests[0]
    first_computed = r.prompt_len + sum(1 for t in r.token_times if t <= move["began"]) - 1
    assert stages[0][2] == blocks_for(first_computed, 16)                      # the first stage: every block
    for start, end, blocks in stages:                   # each: latency + its bytes / bandwidth, by hand
        assert end - start == pytest.approx(per_block[0] + blocks * per_block[1], rel=1e-12)
    for (_, end, _), (start, _, _) in zip(stages, stages[1:]):
        assert start == pytest.approx(end)              # the next stage starts when one ends
    assert move["stop"] >= stages[-1][1]
    assert move["commit"] - move["stop"] == pytest.approx(per_block[0] + move["final_blocks"] * per_block[1])
    assert move["final_blocks"] <= 1 + 1                # at most stop_copy_blocks left (+ the partial one)
    times = r.token_times
    assert any(move["began"] < t <= stages[-1][1] for t in times)      # decoded on the source meanwhile
    assert not any(move["stop"] < t < move["commit"] for t in times)    # and nowhere in the stop-and-copy
    assert all(r.status is Status.FINISHED for r in result.requests) and len(times) == 120
    assert any(s.get(0) for s in seen)                  # the observer saw it in its stop-and-copy


def test_kv_is_conserved_and_the_source_frees_its_blocks_at_the_commit():
    seen: list = []
    frees = []

    def watch(cluster):
        held_blocks_check(seen)(cluster)
        frees.append((cluster.replicas[0].engine.kv.num_free, bool(cluster.migration.moves)))
    cluster = build_cluster(long_trace(), "chunked", lambda: Scripted({0: 0, 1: 1, 2: 1}, move=0, after=80),
                            CFG, link=SLOW_LINK, observer=watch, checked=True)
    result = cluster.run()
    assert result.status == "complete", result.error
    committed_at = next(k for k, (_, done) in enumerate(frees) if done)
    before, after = frees[committed_at - 1][0], frees[committed_at][0]
    moved = cluster.migration.moves[0]["tokens"]
    assert after - before == blocks_for(moved, 16)     # the source's blocks, freed in the commit's turn
    for rep in cluster.replicas:
        assert rep.engine.kv.num_free == rep.engine.kv.num_blocks      # nothing held at the end


def test_a_request_that_finishes_before_its_stop_and_copy_aborts_the_move_and_frees_the_reservation():
    trace = [TraceRequest(0.0, 70, 10), TraceRequest(0.001, 40, 6)]
    seen: list = []
    cluster = build_cluster(trace, "chunked", lambda: Scripted({0: 0, 1: 1}, move=0, after=72), CFG,
                            link=LinkConfig(bandwidth=1e5, latency=1e-3), observer=held_blocks_check(seen))
    result = cluster.run()
    assert result.status == "complete", result.error
    assert cluster.migration.stats["aborted"] == 1 and cluster.migration.stats["committed"] == 0
    assert cluster.replicas[1].engine.kv.num_free == CFG.num_blocks


def test_a_destination_without_room_refuses_the_move():
    trace = [TraceRequest(0.0, 70, 40), TraceRequest(0.0005, 990, 30)]     # replica 1 full
    cluster = build_cluster(trace, "chunked", lambda: Scripted({0: 0, 1: 1}, move=0, after=75), CFG,
                            link=SLOW_LINK)
    result = cluster.run()
    assert result.status == "complete", result.error
    assert cluster.migration.stats["refused"] == 1 and cluster.migration.stats["committed"] == 0
    assert result.requests[0].status is Status.FINISHED


def test_a_migration_of_a_request_not_decoding_on_its_source_breaks_the_routing_contract():
    cluster = build_cluster(long_trace(), "chunked",
                            lambda: Scripted({0: 0, 1: 1, 2: 1}, move=0, after=75, bad=Migration(0, 1, 0)), CFG)
    result = cluster.run()
    assert result.partial and "migration_request" in result.error and "scripted" in result.error


def test_what_migration_cannot_serve_is_refused_in_one_line():
    assert composes({"migration"}, frozenset(), "sim", "replicas") == ""
    assert composes({"migration"}, frozenset(), "sim", "engine") == (
        "migration and one engine do not compose: migration runs on replicas (cluster.replicas > 1)")
    assert composes({"migration"}, frozenset(), "sim", "pd").startswith("migration and P/D disaggregation")
    assert composes({"forks", "migration"}, frozenset(), "sim", "replicas") == (
        "forks and migration do not compose: samples share KV blocks on one replica: a sample is not migrated alone")
    with pytest.raises(ValueError, match="migration and tool_calls do not compose"):
        check_combination({"migration", "tool_calls"}, None, None, "replicas")


def test_a_migrating_router_on_one_engine_is_refused_before_the_run(tmp_path):
    import policylab
    from policylab.apps.jobs import RunError
    with pytest.raises((ValueError, RunError), match="migration and one engine do not compose"):
        policylab.replay("chunked", "poisson", "router=llumnix", "logger=none", "plots=false", "progress=false",
                         dir=tmp_path / "run")
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_migrated_request_generates_the_tokens_of_an_unmigrated_run_on_the_torch_plane(monkeypatch):
    from policylab.cluster import Cluster, Replica
    from policylab.cluster.link import LinkModel
    from policylab.cluster.migration import LiveMigration
    from policylab.dataplane.torch_plane import TorchDataPlane
    from tests.test_cluster_real import CFG as REAL_CFG
    from policylab.core.engine import Engine
    from policylab.testing.loader import load_policy
    from tests.test_cluster_real import TRACE
    from tests.test_dataplane_model import BS, SMALL, dataplane

    def engine():        # steps timed by the cost model: when the move commits is this machine's speed-free
        plane = TorchDataPlane.from_config(dataplane(step_time="model"), SMALL, 0)
        plane.allocate_kv(64, BS)
        return Engine(TRACE, load_policy("chunked"), plane, REAL_CFG, prefix_block_tokens=32)

    def migrated():
        router = Scripted({i: i % 2 for i in range(len(TRACE))}, move=1, after=12, interval=0.001)
        link = LinkModel(LinkConfig(bandwidth=1e7, latency=1e-4))
        cluster = Cluster(TRACE, [Replica(k, "colocated", "cpu", engine()) for k in range(2)], router,
                          migration=LiveMigration(link, kv_bytes_per_token=1024))
        return cluster, cluster.run()
    assert REAL_CFG.block_size == 4
    alone = engine().run()
    cluster, result = migrated()
    assert result.status == "complete", result.error
    assert cluster.migration.stats["committed"] == 1
    assert [r.output_ids for r in result.requests] == [r.output_ids for r in alone.requests]
    # without the copy the destination attends to blocks nobody wrote: the move is what carries the KV
    monkeypatch.setattr(TorchDataPlane, "import_kv", lambda self, table, payload, first=0: None)
    _, unmoved = migrated()
    assert [r.output_ids for r in unmoved.requests] != [r.output_ids for r in alone.requests]


@pytest.mark.timeout(300)
def test_the_cluster_invariants_hold_under_a_rebalancer_that_migrates_on_generated_scenarios():
    """KV conserved on every replica, no request live on two, every request ended, no block held at
    the drain, causality and determinism, with the llumnix router migrating eagerly."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from policies.routers.llumnix import Llumnix
    from policylab.testing.cluster import check_cluster
    from policylab.testing.strategies import scenarios

    moved = []

    @settings(max_examples=25, deadline=None)
    @given(scenarios(max_requests=20, max_output=60), st.sampled_from([2, 3]), st.sampled_from(["chunked", "vllm_v1"]))
    def check(scenario, replicas, policy):
        seen: list = []
        router = lambda: Llumnix(interval=0.002, migrate_out_below=50.0, migrate_in_above=50.0)  # noqa: E731
        result = check_cluster(lambda: build_cluster(scenario.trace, policy, router, scenario.engine,
                                                     replicas=replicas, seed=scenario.seed, checked=True,
                                                     observer=held_blocks_check(seen)))
        moved.append(result.sections["migration"]["committed"])
    check()
    assert sum(moved) > 0                                # (the scenarios did migrate)
