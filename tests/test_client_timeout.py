"""Clients that give up (`trace.client_timeout`): a request not finished that long after it arrived
is rejected with the reason, wherever it is (waiting, or running: its KV freed at once), and the
replay goes on with the others."""
from __future__ import annotations

import dataclasses

import pytest

from policies.chunked import Chunked
from policylab.core.config import EngineConfig
from policylab.core.engine import Engine
from policylab.core.extensions import extensions_for
from policylab.core.extensions.client_timeout import ClientTimeout
from policylab.core.request import Status, TraceRequest
from policylab.testing.harness import _dataplane

pytestmark = pytest.mark.timeout(120)
CFG = EngineConfig(num_blocks=64, block_size=16, max_num_batched_tokens=256, max_num_seqs=2, check_invariants=True)


def replay(trace, timeout, cfg=CFG):
    plane = _dataplane(0)                       # 4 ms a step
    exts = extensions_for(trace, cfg, plane.capabilities, client_timeout=timeout)
    engine = Engine(trace, Chunked(chunk_size=64), plane, cfg, extensions=exts)
    return engine, engine.run()


def test_a_request_its_client_gave_up_on_is_rejected_with_the_reason_and_its_kv_freed():
    # two slots: requests 0 and 1 run for 60 steps (~0.24 s); 2 and 3 wait behind them
    trace = [TraceRequest(0.0, 40, 60), TraceRequest(0.0, 40, 60), TraceRequest(0.0, 40, 5), TraceRequest(0.0, 40, 5)]
    engine, result = replay(trace, timeout=0.1)
    assert result.status == "complete", result.error
    reasons = [r.reject_reason for r in result.requests]
    assert all(r.status is Status.REJECTED and why == "abandoned by its client after 0.1 s"
               for r, why in zip(result.requests, reasons))           # running ones too: nothing finished by 0.1 s
    assert engine.kv.num_free == engine.kv.num_blocks and not engine.running and not engine.waiting
    assert all(0.1 <= r.finish_time <= 0.1 + 0.005 for r in result.requests)   # at the step boundary after it
    assert result.sections["client_timeout"]["abandoned"] == 4
    _, patient = replay(trace, timeout=10.0)
    assert all(r.status is Status.FINISHED for r in patient.requests)
    assert patient.sections["client_timeout"]["abandoned"] == 0


def test_a_waiting_request_leaves_the_queue_and_the_others_are_served():
    trace = [TraceRequest(0.0, 40, 60), TraceRequest(0.0, 40, 60), TraceRequest(0.001, 40, 5)]
    _, result = replay(trace, timeout=0.2, cfg=dataclasses.replace(CFG, max_num_seqs=2))
    statuses = [r.status for r in result.requests]
    assert statuses[2] is Status.REJECTED and result.requests[2].first_scheduled_time is None
    assert statuses[:2] in ([Status.FINISHED] * 2, [Status.REJECTED] * 2)


def test_a_timeout_is_positive_and_finite():
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="trace.client_timeout must be a finite number of seconds > 0"):
            ClientTimeout(bad)


def test_with_forks_it_is_refused_before_the_run():
    trace = [TraceRequest(0.0, 40, 10, n=2)]
    with pytest.raises(ValueError, match="^client_timeout and forks do not compose"):
        replay(trace, timeout=1.0)


def test_replicas_count_their_abandoned_requests_and_report_the_timeout_once(tmp_path):
    import json

    import policylab
    policylab.replay(None, None, "policy=chunked", "trace=poisson", "trace.max_requests=60", "trace.rate_scale=30",
                     "cluster.replicas=2", "trace.client_timeout=0.5", "logger=none", "plots=false", "progress=false",
                     dir=tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    requests = __import__("pandas").read_parquet(tmp_path / "run" / "requests.parquet")
    abandoned = int(requests["reason"].fillna("").str.startswith("abandoned by its client").sum())
    assert summary["client_timeout"] == {"abandoned": abandoned, "timeout_s": 0.5} and abandoned > 0


def closed_loop_replay(sessions, timeout, users=None, gap=0.0):
    from policylab.traces.sessions import plan_of
    plan = plan_of(sessions, users, gap, paced=users is not None)
    exts = extensions_for(plan.trace, CFG, frozenset(), sessions=plan, prefix_block_tokens=16, client_timeout=timeout)
    return Engine(plan.trace, Chunked(chunk_size=64), _dataplane(0), CFG, extensions=exts).run()


def test_a_closed_loop_user_sends_its_next_request_when_it_gives_up():
    """A load generator's slot: one user, a request that cannot finish in time, then one that can; the
    second goes out a round trip after the first was abandoned, not after it would have finished."""
    from policylab.traces.sessions import one_turn_sessions
    trace = [TraceRequest(0.0, 40, 200), TraceRequest(0.0, 40, 5)]          # 200 steps (~0.8 s), then 5
    result = closed_loop_replay(one_turn_sessions(trace), timeout=0.1, users=1, gap=0.01)
    assert result.status == "complete", result.error
    first, second = result.requests
    assert first.status is Status.REJECTED and first.reject_reason == "abandoned by its client after 0.1 s"
    assert second.status is Status.FINISHED
    assert result.trace[1].arrival_time == pytest.approx(first.finish_time + 0.01)
    assert 0.1 <= first.finish_time <= 0.105
    assert result.sections["client_timeout"]["abandoned"] == 1


def test_an_abandoned_turn_ends_its_session():
    from policylab.traces.sessions import Session, Turn
    chat = Session("chat", 0.0, (Turn(40, 200), Turn(8, 5, think_time=0.5), Turn(8, 5, think_time=0.5)))
    result = closed_loop_replay([chat], timeout=0.1)
    assert [r.status for r in result.requests] == [Status.REJECTED] * 3
    assert result.requests[0].reject_reason == "abandoned by its client after 0.1 s"
    assert all(r.reject_reason == "session chat ended: turn 0 was rejected (abandoned by its client after 0.1 s)"
               for r in result.requests[1:])
    assert result.sections["client_timeout"]["abandoned"] == 1
