"""lpm: longest prefix match first raises the hit rate, and its aging bound (a harness property)
keeps a request without hits from starving behind a stream of requests that hit."""
from __future__ import annotations

import pytest

from policies.lpm import LongestPrefixMatch
from policylab.core.config import EngineConfig
from policylab.testing import InvariantViolation, check_policy, run_checked
from policylab.testing.harness import Scenario
from policylab.testing.kv_traces import hit_stream, mooncake_style

pytestmark = pytest.mark.timeout(300)
SERIAL = EngineConfig(block_size=8, num_blocks=400, max_num_batched_tokens=256, max_num_seqs=1, max_model_len=1024)
STREAM = Scenario(hit_stream(40, gap=0.01), SERIAL, prefix_block_tokens=32)


def first_scheduled(result) -> list:
    return [r.first_scheduled_time for r in result.requests]


def test_without_aging_the_request_with_no_hits_waits_for_the_whole_stream():
    result = run_checked(lambda: LongestPrefixMatch(aging_rate=0.0), STREAM)
    times = first_scheduled(result)
    assert times[1] > max(times[2:])              # it arrived second and starts last


def test_aging_bounds_the_wait_and_the_harness_checks_the_bound():
    unaged = first_scheduled(run_checked(lambda: LongestPrefixMatch(aging_rate=0.0), STREAM))
    aged = first_scheduled(check_policy(lambda: LongestPrefixMatch(aging_rate=1000.0), STREAM))
    assert aged[1] < unaged[1]
    # passed only by requests arriving at most 128 cached tokens / 1000 tokens/s after it
    later = [i for i in range(2, len(aged)) if STREAM.trace[i].arrival_time > STREAM.trace[1].arrival_time + 0.1285]
    assert all(aged[i] >= aged[1] for i in later)


class _ForgetsAging(LongestPrefixMatch):
    """Declares an aging rate but orders by prefix match alone."""

    def admission_order(self, view):
        return sorted(view.waiting, key=lambda v: (self.base_key(v), v.arrival_time, v.req_id))


def test_the_harness_catches_an_order_that_ignores_its_aging_rate():
    with pytest.raises(InvariantViolation, match="aging_bound"):
        run_checked(lambda: _ForgetsAging(aging_rate=1000.0), STREAM)


def test_lpm_hits_more_than_fcfs_chunked_on_a_loaded_mooncake_style_trace():
    trace = mooncake_style(150, 3, rate=400.0)
    engine = EngineConfig(block_size=8, num_blocks=160, max_num_batched_tokens=256, max_num_seqs=8, max_model_len=1024)
    scenario = Scenario(trace, engine, prefix_block_tokens=32)
    hits = {name: sum(r.num_cached_tokens_total for r in run_checked(policy, scenario).requests)
            for name, policy in (("fcfs", "chunked"), ("lpm", LongestPrefixMatch))}
    assert hits["lpm"] > hits["fcfs"] > 0


@pytest.mark.parametrize("value", [-1.0, float("nan"), True, "fast"])
def test_bad_aging_rates_are_refused(value):
    with pytest.raises(ValueError, match="aging_rate"):
        LongestPrefixMatch(aging_rate=value)
