"""Two replicas of a real (tiny, seeded) model in one process: routing, and prefill/decode
disaggregation with the K/V really moved between the replicas' caches, change where and when a
request runs, never what it generates (greedy tokens equal the single engine's)."""
from __future__ import annotations

import pytest

from policies.routers.least_loaded import LeastLoaded
from policies.routers.round_robin import RoundRobin
from policylab.cluster import Cluster, LinkConfig, Replica
from policylab.cluster.disagg import Disaggregation, prefill_trace
from policylab.cluster.link import LinkModel
from policylab.core.config import EngineConfig
from policylab.core.engine import Engine
from policylab.core.request import Status, TraceRequest
from policylab.testing.loader import load_policy
from tests.test_dataplane_model import SMALL, make_plane

TRACE = [TraceRequest(0.002 * k, p, o, prefix_hashes=h) for k, (p, o, h) in
         enumerate([(40, 6, (7,)), (9, 8, ()), (36, 5, (7,)), (23, 7, ()), (5, 9, ()), (30, 4, (7,))])]
CFG = EngineConfig(block_size=4, num_blocks=64, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=128)


def engine(trace: list = TRACE) -> Engine:
    return Engine(trace, load_policy("chunked"), make_plane(SMALL, num_blocks=64), CFG, prefix_block_tokens=32)


@pytest.mark.slow
def test_routing_never_changes_the_generated_tokens():
    alone = engine().run()
    assert alone.status == "complete"
    for router in (RoundRobin(), LeastLoaded()):
        result = Cluster(TRACE, [Replica(k, "colocated", "cpu", engine()) for k in range(2)], router).run()
        assert result.status == "complete" and set(result.placement["replica"]) == {0, 1}
        assert all(r.status is Status.FINISHED for r in result.requests)
        assert [r.output_ids for r in result.requests] == [r.output_ids for r in alone.requests]


def disaggregated() -> Cluster:
    pd = Disaggregation(RoundRobin(), LinkModel(LinkConfig()), kv_bytes_per_token=1024)
    return Cluster(TRACE, [Replica(0, "prefill", "cpu", engine(prefill_trace(TRACE))),
                           Replica(1, "decode", "cpu", engine())], RoundRobin(), pd)


def test_a_real_pd_handoff_moves_the_kv_and_decodes_what_one_engine_would(monkeypatch):
    alone = engine().run()
    result = disaggregated().run()
    assert result.status == "complete" and all(r.status is Status.FINISHED for r in result.requests)
    assert list(result.placement["decode_replica"]) == [1] * len(TRACE)     # every request handed off
    assert [r.output_ids for r in result.requests] == [r.output_ids for r in alone.requests]
    # without the copy the decode replica attends to blocks the prefill replica never wrote
    from policylab.dataplane.torch_plane import TorchDataPlane
    monkeypatch.setattr(TorchDataPlane, "import_kv", lambda self, table, payload, first=0: None)
    unmoved = disaggregated().run()
    assert [r.output_ids for r in unmoved.requests] != [r.output_ids for r in alone.requests]


def test_a_kv_payload_that_does_not_fit_the_blocks_is_refused_with_both_shapes():
    plane = make_plane(SMALL, num_blocks=16)
    payload = plane.export_kv([3, 5])
    plane.import_kv([7, 9], payload)
    assert bool((plane.export_kv([7, 9]) == payload).all())
    import pytest
    with pytest.raises(ValueError, match=r"does not fit 3 blocks of a cache shaped"):
        plane.import_kv([1, 2, 4], payload)
