"""Two replicas of a real (tiny, seeded) model in one process: routing changes where and when a
request runs, never what it generates (greedy tokens equal the single engine's)."""
from __future__ import annotations

from policies.routers.least_loaded import LeastLoaded
from policies.routers.round_robin import RoundRobin
from policylab.cluster import Cluster, Replica
from policylab.core.config import EngineConfig
from policylab.core.engine import Engine
from policylab.core.request import Status, TraceRequest
from policylab.testing.loader import load_policy
from tests.test_dataplane_model import SMALL, make_plane

TRACE = [TraceRequest(0.002 * k, p, o, prefix_hashes=h) for k, (p, o, h) in
         enumerate([(40, 6, (7,)), (9, 8, ()), (36, 5, (7,)), (23, 7, ()), (5, 9, ()), (30, 4, (7,))])]
CFG = EngineConfig(block_size=4, num_blocks=64, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=128)


def engine() -> Engine:
    return Engine(TRACE, load_policy("chunked"), make_plane(SMALL, num_blocks=64), CFG, prefix_block_tokens=32)


def test_routing_never_changes_the_generated_tokens():
    alone = engine().run()
    assert alone.status == "complete"
    for router in (RoundRobin(), LeastLoaded()):
        result = Cluster(TRACE, [Replica(k, "colocated", "cpu", engine()) for k in range(2)], router).run()
        assert result.status == "complete" and set(result.placement["replica"]) == {0, 1}
        assert all(r.status is Status.FINISHED for r in result.requests)
        assert [r.output_ids for r in result.requests] == [r.output_ids for r in alone.requests]
