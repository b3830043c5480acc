"""Prefill/decode disaggregation: TTFT at the end of prefill, the KV transfer from the link model
as its own column, the decode-side wait for KV blocks counted, and Vidur's send_recv profile
read as published."""
import dataclasses
import math
from pathlib import Path

import pytest

from policies.routers.least_loaded import LeastLoaded
from policies.routers.round_robin import RoundRobin
from policylab.cluster import LinkConfig
from policylab.cluster.link import LinkModel
from policylab.core.config import EngineConfig, ModelConfig
from policylab.core.request import TraceRequest
from policylab.dataplane.sim import ModelShape
from policylab.testing.cluster import build_cluster, check_cluster

CFG = EngineConfig(num_blocks=64, block_size=16, max_num_batched_tokens=512, max_num_seqs=16)
PROFILE = Path(__file__).resolve().parents[1] / ".." / "shared" / "profiles" / "vidur" / "network" / "h100_dgx" / \
    "send_recv.csv"


def test_ttft_ends_prefill_and_the_transfer_is_its_own_column():
    trace = [TraceRequest(0.01 * k, 160, 8) for k in range(6)] + [TraceRequest(0.2, 40, 1)]
    link = LinkConfig(bandwidth=1e9, latency=0.002)
    cluster = build_cluster(trace, "prefill_first", RoundRobin, CFG, prefill=1, decode=1, link=link)
    result = cluster.run()
    assert result.status == "complete"
    bytes_per_token = ModelShape(ModelConfig()).kv_bytes_per_token
    for i, r in enumerate(result.requests[:6]):
        prefill = cluster.replicas[0].engine.requests[i]
        assert prefill.finish_time == prefill.token_times[0] == r.token_times[0]     # TTFT: end of prefill
        assert result.placement["replica"][i] == 0 and result.placement["decode_replica"][i] == 1
        assert result.placement["transfer_time"][i] == pytest.approx(0.002 + 160 * bytes_per_token / 1e9)
        assert r.token_times[1] >= prefill.finish_time + result.placement["transfer_time"][i]
        assert len(r.output_ids) == 8 and cluster.replicas[1].engine.requests[i] is r
    one_token = result.requests[6]            # nothing to decode: it ends on the prefill replica
    assert result.placement["decode_replica"][6] == -1 and math.isnan(result.placement["transfer_time"][6])
    assert one_token.status.value == "finished" and len(one_token.output_ids) == 1


@pytest.mark.timeout(30)
@pytest.mark.parametrize("latency", [0.0, 0.5])
def test_the_transfer_delays_decode_by_the_link_time(latency):
    """One request, idle replicas, an empty decode cache (no KV wait): its KV leaves the prefill
    replica with its first token and the decode replica's first step starts exactly when it lands,
    latency + prompt KV bytes / bandwidth later; that step's end is the second token."""
    bandwidth, prompt = 1e9, 160
    trace = [TraceRequest(0.0, prompt, 3)]
    cluster = build_cluster(trace, "prefill_first", RoundRobin, CFG, prefill=1, decode=1,
                            link=LinkConfig(bandwidth=bandwidth, latency=latency))
    result = cluster.run()
    assert result.status == "complete"
    transfer = latency + prompt * ModelShape(ModelConfig()).kv_bytes_per_token / bandwidth
    assert result.placement["kv_wait"][0] == 0
    decode = result.steps["replica"] == 1
    start, duration = result.steps["clock"][decode][0], result.steps["duration"][decode][0]
    r = result.requests[0]
    assert start == pytest.approx(r.token_times[0] + transfer, abs=1e-12)
    assert r.token_times[1] == pytest.approx(start + duration, abs=1e-12)


def test_a_full_decode_replica_makes_the_handoff_wait_and_counts_it():
    trace = [TraceRequest(0.0, 200, 120), TraceRequest(0.001, 200, 120), TraceRequest(0.002, 200, 120)]
    small = dataclasses.replace(CFG, num_blocks=36)      # 2 requests' prompts fit, not 3 with their outputs
    result = check_cluster(lambda: build_cluster(trace, "prefill_first", RoundRobin, small, prefill=1, decode=1,
                                                 checked=True))
    waits = result.placement["kv_wait"]
    assert waits[0] == 0 and max(waits) > 0.1      # the last waits for a decode to finish and free blocks


@pytest.mark.parametrize("policy", ["prefill_first", "decode_first", "chunked"])
def test_handoffs_never_hold_a_decode_replicas_kv_beyond_what_it_can_run(policy):
    """With max_num_seqs=1 and a small cache, handoffs that took the decode replica's blocks
    while one request ran left it no block to grow and nothing to preempt: the replay stopped
    with a liveness error blamed on a correct policy. Handoffs now wait while the running
    requests and the handoffs holding blocks fill max_num_seqs."""
    spec = [(144, 7), (56, 12), (42, 7), (6, 16), (48, 17), (188, 9), (194, 1), (53, 4), (30, 2), (143, 1), (1, 1)]
    trace = [TraceRequest(0.0, p, o) for p, o in spec]
    cfg = EngineConfig(block_size=1, num_blocks=198, max_num_batched_tokens=8, max_num_seqs=1,
                       enable_prefix_caching=False)
    result = check_cluster(lambda: build_cluster(trace, policy, RoundRobin, cfg, prefill=2, decode=1,
                                                 prefix_block_tokens=16, checked=True))
    assert result.status == "complete" and all(r.status == "finished" for r in result.requests)


def test_decode_router_is_a_plugin_and_spreads_decodes():
    trace = [TraceRequest(0.002 * k, 100, 30) for k in range(8)]
    result = build_cluster(trace, "chunked", RoundRobin, CFG, prefill=1, decode=2,
                           decode_router_factory=LeastLoaded).run()
    assert sorted(set(result.placement["decode_replica"])) == [1, 2]


@pytest.mark.skipif(not PROFILE.is_file(), reason="../shared/profiles/vidur/network not present")
def test_vidur_send_recv_profile_is_read_as_published():
    intra = LinkModel(LinkConfig(kind="profile", profile=str(PROFILE), devices_per_node=2))
    cross = LinkModel(LinkConfig(kind="profile", profile=str(PROFILE), devices_per_node=1))
    size = 64 * 2 ** 20                                    # 64 MiB: NVLink ~0.2 ms, InfiniBand ~1.8 ms
    assert 1e-4 < intra.transfer_time(size) < 4e-4 and 1e-3 < cross.transfer_time(size) < 3e-3
    assert cross.transfer_time(2 * size) == pytest.approx(2 * cross.transfer_time(size), rel=0.15)


def test_a_file_that_is_not_a_profile_fails_in_one_line(tmp_path):
    bad = tmp_path / "send_recv.csv"
    bad.write_text("size,time\n1,2\n")
    with pytest.raises(ValueError, match="not a Vidur send_recv profile"):
        LinkModel(LinkConfig(kind="profile", profile=str(bad)))


class RejectsArrivingDecodes:
    """Prefill-first, except that a request arriving with its prompt computed is rejected."""

    def __init__(self, name="rejects_decodes"):
        from policies.prefill_first import PrefillFirst
        self.name, self.inner = name, PrefillFirst()

    def schedule(self, view):
        from policylab.core.contract import StepPlan
        late = {v.req_id: "too late to decode" for v in view.waiting if v.num_computed_tokens}
        return StepPlan(reject=late) if late else self.inner.schedule(view)

    def on_finished(self, view):
        pass


def test_a_decode_side_rejection_frees_the_received_kv():
    trace = [TraceRequest(0.01 * k, 160, 8) for k in range(4)]
    result = check_cluster(lambda: build_cluster(trace, RejectsArrivingDecodes, RoundRobin, CFG, prefill=1,
                                                 decode=1, checked=True))
    assert [r.reject_reason for r in result.requests] == ["rejected by policy: too late to decode"] * 4


# ---------------------------------------------------------------- a step policy per pool
HANDOFFS = [TraceRequest(0.005 * k, 60, 6 + 5 * (k % 4)) for k in range(16)]


def held_back(result, replica: int) -> int:
    """Steps of `replica` in which requests waited while others ran."""
    steps = result.replicas[replica].result.steps
    return sum(1 for w, n in zip(steps["waiting"], steps["running"]) if w and n)


def test_the_decode_pool_runs_its_own_policy_and_the_prefill_pool_is_untouched():
    runs = {d: build_cluster(HANDOFFS, "prefill_first", RoundRobin, CFG, prefill=1, decode=1, decode_policy=d).run()
            for d in (None, "decode_first")}
    same, mixed = runs[None], runs["decode_first"]
    assert same.status == mixed.status == "complete"
    assert same.policy == "prefill_first" and mixed.policy == "prefill_first+decode_first"
    assert [p.policy for p in mixed.replicas] == ["prefill_first", "decode_first"]
    # the prefill pool ran prefill_first in both: the same steps, the same first tokens
    assert {k: list(v) for k, v in same.replicas[0].result.steps.items()} == \
        {k: list(v) for k, v in mixed.replicas[0].result.steps.items()}
    assert [r.token_times[0] for r in same.requests] == [r.token_times[0] for r in mixed.requests]
    # decode_first on the decode replica admits the arriving prefilled requests only into a drained
    # batch: they wait while a batch runs (never under prefill_first), and their second token is later
    assert held_back(same, 1) == 0 < held_back(mixed, 1)
    second = {k: max(r.token_times[1] - r.token_times[0] for r in v.requests) for k, v in runs.items()}
    assert second["decode_first"] > 5 * second[None]


def test_the_prefill_pool_runs_its_own_policy_and_parameters():
    small_chunks = {"_target_": "policies.chunked.Chunked", "name": "chunked", "chunk_size": 32}
    result = check_cluster(lambda: build_cluster(HANDOFFS, "prefill_first", RoundRobin, CFG, prefill=1, decode=1,
                                                 prefill_policy=small_chunks, checked=True))
    assert result.policy == "chunked+prefill_first"
    prefill, decode = (p.result.steps for p in result.replicas)
    assert max(prefill["prefill_tokens"]) == 32          # 60-token prompts in chunks of at most 32
    assert max(decode["prefill_tokens"]) == 0             # (prompts arrive computed on the decode pool)
    alone = build_cluster(HANDOFFS, "prefill_first", RoundRobin, CFG, prefill=1, decode=1).run()
    assert max(alone.replicas[0].result.steps["prefill_tokens"]) > 32


class DoubleDecode:
    """prefill_first, except that a decode is given 2 tokens: a broken contract that only a replica
    that decodes can commit (a prefill replica's requests end with their first token)."""

    def __init__(self, name="double_decode"):
        from policies.prefill_first import PrefillFirst
        self.name, self.inner = name, PrefillFirst()

    def schedule(self, view):
        from policylab.core.contract import StepPlan
        plan = self.inner.schedule(view)
        decoding = {v.req_id for v in view.running if v.is_decode}
        return StepPlan({rid: 2 if rid in decoding else n for rid, n in plan.num_scheduled_tokens.items()},
                        plan.preempt, plan.reject)

    def on_finished(self, view):
        pass


def test_a_broken_contract_on_one_pool_names_that_pools_policy_and_replica():
    trace = HANDOFFS[:6]
    on_decode = build_cluster(trace, "prefill_first", RoundRobin, CFG, prefill=1, decode=2,
                              decode_router_factory=LeastLoaded, decode_policy=DoubleDecode).run()
    assert on_decode.partial and on_decode.error.startswith(
        "ContractViolation: policy 'double_decode' broke rule 'decode_one'")
    assert on_decode.error.endswith("(on decode replica 1)")
    on_prefill = build_cluster(trace, "prefill_first", RoundRobin, CFG, prefill=1, decode=1,
                               prefill_policy=DoubleDecode).run()
    assert on_prefill.status == "complete"      # never decodes there: nothing to break


def test_a_broken_contract_on_a_colocated_replica_names_it():
    from policylab.testing.cluster import build_cluster as build
    result = build(HANDOFFS[:6], DoubleDecode, RoundRobin, CFG, replicas=2).run()
    assert result.partial and result.error.startswith("ContractViolation: policy 'double_decode' broke rule 'decode_one'")
    assert result.error.endswith("(on colocated replica 0)")        # request 0 decodes first there
