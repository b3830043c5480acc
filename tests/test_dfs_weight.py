"""dfs_weight: SGLang's DFS-weight order over the waiting requests' prefix matches, the same under
either prefix index and FCFS without a prefix cache; its max_wait_s bound (a harness property)
keeps a request without hits from starving behind a stream of requests that hit."""
from __future__ import annotations

import dataclasses

import pytest

from policies.dfs_weight import DfsWeight, common_prefix, dfs_weight_order
from policies.lpm import LongestPrefixMatch
from policylab.core.config import EngineConfig
from policylab.testing import InvariantViolation, check_policy, run_checked
from policylab.testing.harness import Scenario, fingerprint
from policylab.testing.kv_traces import hit_stream, mooncake_style

pytestmark = pytest.mark.timeout(300)
SERIAL = EngineConfig(block_size=8, num_blocks=400, max_num_batched_tokens=256, max_num_seqs=1, max_model_len=1024)
STREAM = Scenario(hit_stream(40, gap=0.01), SERIAL, prefix_block_tokens=32)
LOADED = EngineConfig(block_size=8, num_blocks=160, max_num_batched_tokens=256, max_num_seqs=8, max_model_len=1024)
ROOMY = dataclasses.replace(LOADED, num_blocks=4000)


def test_heavier_branches_first_a_nodes_own_requests_after_its_children():
    a, b, c = (1,), (1, 2), (1, 3)
    paths = [(), a, (9,), c, b, (1, 3, 4), c, (9,)]
    #   root ─ 1 (weight 5: a, b, c, c, c+4) ─ 3 (weight 3) ─ 4
    #        │                               └ 2 (weight 1)
    #        └ 9 (weight 2)
    assert dfs_weight_order(paths) == [5, 3, 6, 4, 1, 2, 7, 0]


def test_equal_weights_go_in_queue_order_and_no_hits_keep_queue_order():
    assert dfs_weight_order([(), (5,), (), (4,)]) == [1, 3, 0, 2]
    assert dfs_weight_order([(), (), ()]) == [0, 1, 2]


@pytest.mark.parametrize("a, b, n", [((), (), 0), ((1, 2), (1, 2), 2), ((1, 2, 3), (1, 2, 4), 2), ((1,), (2,), 0),
                                     ((1, 2), (1, 2, 3), 2)])
def test_common_prefix(a, b, n):
    assert common_prefix(a, b) == n


def hits(result) -> int:
    return sum(r.num_cached_tokens_total for r in result.requests)


def test_dfs_weight_hits_more_than_fcfs_chunked_on_a_loaded_mooncake_style_trace():
    scenario = Scenario(mooncake_style(150, 3, rate=400.0), LOADED, prefix_block_tokens=32)
    assert hits(run_checked(DfsWeight, scenario)) > hits(run_checked("chunked", scenario)) > 0


@pytest.mark.parametrize("engine", [ROOMY, LOADED], ids=["roomy", "loaded"])
def test_hash_and_radix_indexes_give_the_same_order(engine):
    """Replays are identical where the two indexes hold the same blocks (the radix tree evicts
    leaves first, which can change what is cached under pressure; it does not on this trace)."""
    trace = mooncake_style(80, 1, rate=400.0)
    runs = [run_checked(DfsWeight, Scenario(trace, dataclasses.replace(engine, prefix_cache=index),
                                            prefix_block_tokens=32)) for index in ("hash", "radix")]
    assert hits(runs[0]) > 0
    assert fingerprint(runs[0]) == fingerprint(runs[1])


def test_without_a_prefix_cache_the_order_is_fcfs():
    trace = mooncake_style(80, 2, rate=400.0)
    off = Scenario(trace, dataclasses.replace(LOADED, enable_prefix_caching=False), prefix_block_tokens=32)
    assert fingerprint(run_checked(DfsWeight, off)) == fingerprint(run_checked("chunked", off))


def first_scheduled(result) -> list:
    return [r.first_scheduled_time for r in result.requests]


@pytest.mark.parametrize("policy", [lambda **k: DfsWeight(**k), lambda **k: LongestPrefixMatch(aging_rate=0.0, **k)],
                         ids=["dfs_weight", "lpm_no_aging"])
def test_max_wait_bounds_the_wait_of_a_request_without_hits(policy):
    unbounded = first_scheduled(run_checked(lambda: policy(max_wait_s=None), STREAM))
    assert unbounded[1] > max(unbounded[2:])          # arrived second, starts last
    bound = 0.05
    bounded = first_scheduled(check_policy(lambda: policy(max_wait_s=bound), STREAM))
    assert bounded[1] < unbounded[1]
    # once overdue it is next: it starts within the bound plus one request's service
    waited = bounded[1] - STREAM.trace[1].arrival_time
    service = max(b - a for a, b in zip(sorted(bounded), sorted(bounded)[1:]))
    assert bound < waited <= bound + service
    assert all(bounded[i] > bounded[1] for i in range(2, len(bounded))
               if STREAM.trace[i].arrival_time > STREAM.trace[1].arrival_time + bound + service)


class _IgnoresMaxWait(DfsWeight):
    """Declares a bound on waiting but keeps the DFS order alone."""

    def admission_order(self, view):
        return [view.waiting[i] for i in dfs_weight_order([v.cached_blocks() for v in view.waiting])]


def test_the_harness_catches_an_order_that_ignores_its_max_wait():
    with pytest.raises(InvariantViolation, match="max_wait"):
        run_checked(lambda: _IgnoresMaxWait(max_wait_s=0.05), STREAM)


@pytest.mark.parametrize("cls", [DfsWeight, LongestPrefixMatch])
@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), True, "10s"])
def test_bad_max_waits_are_refused(cls, value):
    with pytest.raises(ValueError, match="max_wait_s"):
        cls(max_wait_s=value)
