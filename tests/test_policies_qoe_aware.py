"""qoe_aware's own rules: a request that has shown nothing yet gets room by preempting a running request
whose reader has seconds of text buffered; FCFS makes it wait; every request still finishes."""
from __future__ import annotations

import pytest

from policies.qoe_aware import QoeAware
from policylab.core.config import EngineConfig
from policylab.core.request import TraceRequest
from policylab.testing.replay import replay

pytestmark = pytest.mark.timeout(120)
CFG = EngineConfig(max_num_seqs=2, num_blocks=600, block_size=16, host_kv_blocks=600)


def trace() -> list:
    """Two long answers start at once and fill both sequence slots; a third request arrives at 3 s,
    when each running answer is hundreds of tokens (a minute of reading at 5 tokens/s) ahead."""
    return [TraceRequest(0.0, 64, 2000), TraceRequest(0.0, 64, 2000), TraceRequest(3.0, 64, 20)]


def ttft_of_third(policy) -> tuple:
    result, _ = replay(policy, trace(), CFG)
    third = result.requests[2]
    assert all(r.status.value == "finished" for r in result.requests)
    return third.token_times[0] - 3.0, sum(r.num_preemptions for r in result.requests)


def test_a_waiting_request_gets_room_from_a_buffered_one():
    qoe_ttft, preemptions = ttft_of_third(QoeAware(expected_ttft=1.0, expected_tds=5.0))
    fcfs_ttft, fcfs_preemptions = ttft_of_third("chunked")
    assert qoe_ttft < 0.5 and preemptions >= 1            # it started within a few steps
    assert fcfs_ttft > 2.0 and fcfs_preemptions == 0       # FCFS: it waits for a slot to free


def test_no_room_is_made_when_the_running_readers_have_nothing_buffered():
    # a reader pace faster than the engine decodes: nobody is ahead of its reader, nobody is preempted
    qoe_ttft, preemptions = ttft_of_third(QoeAware(expected_ttft=1.0, expected_tds=1e6))
    assert preemptions == 0 and qoe_ttft > 2.0


def test_a_preempted_request_is_read_in_order_again():
    policy = QoeAware(expected_ttft=1.0, expected_tds=5.0)
    result, _ = replay(policy, trace(), CFG)
    assert not policy.read                                   # finished requests leave no state
    first = result.requests[0].token_times
    assert first == sorted(first) and len(first) == 2000


@pytest.mark.parametrize("kwargs, key", [({"expected_tds": 0}, "expected_tds"), ({"expected_ttft": -1}, "expected_ttft"),
                                         ({"min_buffer_s": -1}, "min_buffer_s"), ({"max_preempt": 1.5}, "max_preempt"),
                                         ({"preemption_cap": -1}, "preemption_cap")])
def test_bad_parameters_are_refused_by_name(kwargs, key):
    with pytest.raises(ValueError, match=key):
        QoeAware(**kwargs)
