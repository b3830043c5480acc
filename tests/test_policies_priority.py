"""priority: static classes (lower first), FCFS inside a class, aging against starvation."""
import pytest

from policies.priority import Priority
from policylab.core.config import EngineConfig
from policylab.core.request import TraceRequest as T
from policylab.testing.replay import replay

ONE_AT_A_TIME = EngineConfig(block_size=16, num_blocks=200, max_num_batched_tokens=512, max_num_seqs=1)


def order(result) -> list:
    return [rid for _, rid in sorted((r.first_scheduled_time, r.req_id) for r in result.requests)]


def test_lower_class_first_fcfs_inside_a_class():
    trace = [T(0.0, 40, 4, priority=p) for p in (2, 0, 1, 0, 2)]
    result, _ = replay(Priority(aging_rate=0.0), trace, ONE_AT_A_TIME)
    assert order(result) == [1, 3, 2, 0, 4]


def stream_with_one_low_priority_request() -> list:
    """A class-2 request at t=0 and a steady stream of class-0 requests keeping the server busy."""
    return [T(0.0, 40, 4, priority=2)] + [T(0.01 * i, 40, 4, priority=0) for i in range(60)]


def test_without_aging_the_low_class_starves_until_the_stream_ends():
    result, _ = replay(Priority(aging_rate=0.0), stream_with_one_low_priority_request(), ONE_AT_A_TIME)
    assert order(result)[-1] == 0


def test_aging_bounds_how_long_later_arrivals_may_pass():
    rate = 20.0                                    # 2 classes / 20 per s: passed for at most 0.1 s
    result, _ = replay(Priority(aging_rate=rate), stream_with_one_low_priority_request(), ONE_AT_A_TIME)
    started = result.requests[0].first_scheduled_time
    passed_it = [r for r in result.requests[1:] if r.first_scheduled_time < started]
    assert passed_it, "the stream should pass it for a while"
    assert all(r.arrival_time <= (2 - 0) / rate + 1e-9 for r in passed_it)
    assert started < result.requests[-1].first_scheduled_time


def test_kv_shortage_preempts_the_worst_class():
    trace = [T(0.0, 40, 60, priority=p) for p in (0, 2, 1, 0, 1, 2)]
    cfg = EngineConfig(block_size=8, num_blocks=40, max_num_batched_tokens=512, max_num_seqs=8)
    _, records = replay(Priority(aging_rate=0.0), trace, cfg)
    victims = [rid for r in records for rid in r.plan.preempt]
    assert victims, "the cache is too small for all six"
    first = next(r for r in records if r.plan.preempt)
    worst = max(first.running, key=lambda rid: (trace[rid].priority, rid))
    assert first.plan.preempt[0] == worst


def test_rejects_negative_aging():
    with pytest.raises(ValueError, match="aging_rate"):
        Priority(aging_rate=-1)
