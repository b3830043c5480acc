"""Closed-loop replays (policylab.core.extensions.sessions): a session's next turn arrives its think time
after the previous one finished, with the conversation so far as its prompt (so the prefix cache
hits it); a rejected turn ends its session; `concurrency` users never have more requests in flight;
the same event order on an engine, a cluster (also under P/D), and the invariant harness with
every shipped policy; an open-loop trace with the feature off replays exactly as before."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from policies.prefill_first import PrefillFirst
from policies.routers.round_robin import RoundRobin
from policies.routers.session import Session as SessionRouter
from policylab.core.config import EngineConfig, ModelConfig
from policylab.core.engine import Engine
from policylab.core.request import Status, TraceRequest
from policylab.dataplane.sim import SimDataPlane
from policylab.testing import fingerprint
from policylab.testing.cluster import build_cluster
from policylab.testing.harness import Scenario, check_policy
from policylab.testing.loader import shipped_policy_configs, spec_id
from policylab.testing.properties import InvariantViolation
from policylab.testing.replay import SCENARIO_HARDWARE, scenario_dataplane
from policylab.testing.session_invariants import check_sessions
from policylab.traces.sessions import Session, Turn, one_turn_sessions, plan_of

pytestmark = pytest.mark.timeout(300)
CFG = EngineConfig(num_blocks=128, block_size=16, max_num_batched_tokens=256, max_num_seqs=8)


def chat(n_sessions=6, turns=4, think=0.05, gap=0.02, new=(60, 20), out=12):
    return [Session(f"s{j}", gap * j, tuple(Turn(new[0] + j if k == 0 else new[1] + k, out + (j + k) % 5,
                                                 think * (1 + (j + k) % 3)) for k in range(turns)))
            for j in range(n_sessions)]


def engine_on(trace, cfg=CFG, policy=None, seed=0, sessions=None):
    plane = SimDataPlane(ModelConfig(), SCENARIO_HARDWARE, scenario_dataplane(SCENARIO_HARDWARE), seed=seed)
    return Engine(list(trace), policy or PrefillFirst(name="prefill_first"), plane, cfg, seed=seed,
                  prefix_block_tokens=32, sessions=sessions)


def closed_loop_run(plan, cfg=CFG, policy=None):
    engine = engine_on(plan.trace, cfg, policy, sessions=plan)
    result = engine.run()
    assert not result.partial, result.error
    return result


def test_each_turn_arrives_think_time_after_the_last_finished_with_the_conversation_as_prompt():
    plan = plan_of(chat())
    result = closed_loop_run(plan)
    check_sessions(result, plan)
    reqs = result.requests
    for i, r in enumerate(reqs):
        assert r.status is Status.FINISHED
        if plan.turn[i]:
            prev = reqs[i - 1]
            assert r.arrival_time == pytest.approx(prev.finish_time + plan.think_time[i])
            history = list(prev.prompt_ids) + list(prev.output_ids)
            assert list(r.prompt_ids[:len(history)]) == history
            assert len(r.prompt_ids) == len(history) + plan.new_tokens[i]
            assert r.num_cached_tokens_total >= (len(history) // 16 - 1) * 16   # the conversation is a cache hit
    assert result.sections["sessions"] is plan


def test_the_prefix_cache_sees_the_conversation_only_when_turns_extend_it():
    """The same turns as independent open-loop requests (same prompt lengths) hit nothing."""
    plan = plan_of(chat())
    closed = closed_loop_run(plan)
    open_trace = [dataclasses.replace(t, arrival_time=r.arrival_time, prompt_tokens=len(r.prompt_ids))
                  for t, r in zip(plan.trace, closed.requests)]
    opened = engine_on(open_trace).run()
    assert sum(r.num_cached_tokens_total for r in closed.requests) > 0.5 * sum(len(r.prompt_ids) for r in
                                                                               closed.requests if r.output_ids)
    assert sum(r.num_cached_tokens_total for r in opened.requests) == 0


def test_a_rejected_turn_ends_its_session_with_a_reason():
    sessions = chat(n_sessions=3, turns=4)
    long_turn = dataclasses.replace(sessions[1].turns[1], new_tokens=5000)     # never fits max_model_len
    sessions[1] = dataclasses.replace(sessions[1], turns=(sessions[1].turns[0], long_turn, *sessions[1].turns[2:]))
    plan = plan_of(sessions)
    result = closed_loop_run(plan, dataclasses.replace(CFG, max_model_len=1024))
    check_sessions(result, plan)
    by_session = [r for i, r in enumerate(result.requests) if plan.session[i] == "s1"]
    assert [r.status for r in by_session] == [Status.FINISHED] + [Status.REJECTED] * 3
    assert all("session s1 ended: turn 1 was rejected" in r.reject_reason for r in by_session[2:])
    others = [r for i, r in enumerate(result.requests) if plan.session[i] != "s1"]
    assert all(r.status is Status.FINISHED for r in others)


@pytest.mark.parametrize("users", [1, 3])
def test_concurrency_users_never_exceed_their_number_and_send_when_the_last_finished(users):
    trace = [TraceRequest(0.001 * i, 40 + 7 * i % 50, 5 + i % 9) for i in range(30)]
    plan = plan_of(one_turn_sessions(trace), concurrency=users)
    result = closed_loop_run(plan)
    check_sessions(result, plan)
    reqs = result.requests
    assert [r.arrival_time for r in reqs[:users]] == [0.0] * users
    finishes = sorted(r.finish_time for r in reqs)
    later = sorted(r.arrival_time for r in reqs[users:])
    assert later == pytest.approx(finishes[:len(later)])      # each arrival is a completion
    events = sorted([(r.arrival_time, 1) for r in reqs] + [(r.finish_time, -1) for r in reqs])
    assert max(np.cumsum([c for _, c in events])) == users
    one = closed_loop_run(plan_of(one_turn_sessions(trace), concurrency=1)).requests
    assert all(a.finish_time <= b.arrival_time + 1e-12 for a, b in zip(one, one[1:]))   # one user: serial


def test_the_checker_catches_a_turn_that_came_early():
    plan = plan_of(chat(n_sessions=2, turns=2))
    result = closed_loop_run(plan)
    result.requests[1].arrival_time = result.requests[0].finish_time - 0.01
    with pytest.raises(InvariantViolation, match="session_order"):
        check_sessions(result, plan)


@pytest.mark.parametrize("policy", shipped_policy_configs(), ids=spec_id)
def test_invariants_hold_in_closed_loop_for_every_shipped_policy(policy):
    tight = EngineConfig(num_blocks=48, block_size=8, max_num_batched_tokens=128, max_num_seqs=6)
    for plan in (plan_of(chat(n_sessions=5, turns=3, think=0.01, gap=0.0)),
                 plan_of(one_turn_sessions([TraceRequest(0.0, 30 + 11 * i % 40, 4 + i % 7, client=f"c{i % 2}")
                                            for i in range(16)]), concurrency=4)):
        check_policy(policy, Scenario(tuple(plan.trace), tight, seed=1, prefix_block_tokens=32, sessions=plan))


@pytest.mark.parametrize("shape", [dict(replicas=1), dict(replicas=3), dict(prefill=1, decode=2)])
def test_clusters_replay_the_same_closed_loop(shape):
    plan = plan_of(chat(n_sessions=8, turns=3))
    cluster = build_cluster(plan.trace, "prefill_first", SessionRouter, CFG, checked=True, sessions=plan, **shape)
    result = cluster.run()
    assert not result.partial, result.error
    check_sessions(result, plan)
    if shape.get("replicas") == 1:           # one replica: exactly the engine's replay
        alone = closed_loop_run(plan)
        assert [(r.arrival_time, r.finish_time, r.num_cached_tokens_total) for r in result.requests] == \
            [(r.arrival_time, r.finish_time, r.num_cached_tokens_total) for r in alone.requests]
    if shape.get("replicas") == 3:           # the session router keeps a conversation on one replica
        for s in set(plan.session):
            assert len({result.placement["replica"][i] for i in range(len(plan.trace)) if plan.session[i] == s}) == 1


def test_round_robin_scatters_a_conversation_and_loses_its_cache_hits():
    plan = plan_of(chat(n_sessions=4, turns=4))
    hits = {}
    for router in (SessionRouter, RoundRobin):
        cluster = build_cluster(plan.trace, "prefill_first", router, CFG, replicas=3, sessions=plan)
        hits[router] = sum(r.num_cached_tokens_total for r in cluster.run().requests)
    assert hits[SessionRouter] > hits[RoundRobin]


def test_closed_loop_replays_are_deterministic_and_open_loop_unchanged():
    plan = plan_of(chat())
    assert fingerprint(closed_loop_run(plan)) == fingerprint(closed_loop_run(plan))
    trace = [TraceRequest(0.003 * i, 40 + i, 6) for i in range(20)]
    plain = engine_on(trace).run()
    assert fingerprint(plain) == fingerprint(engine_on(trace).run()) and "sessions" not in plain.sections


@pytest.mark.slow
def test_on_the_torch_plane_each_turn_extends_what_the_model_really_generated():
    """The real model's greedy output is in the next turn's prompt, and a turn decodes exactly what
    the same prompt decodes as a lone request (the cache hit on the conversation changes nothing)."""
    from policylab.testing.loader import load_policy
    from tests.test_dataplane_model import SMALL, make_plane
    cfg = EngineConfig(block_size=4, num_blocks=96, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=256)
    plan = plan_of(chat(n_sessions=2, turns=3, new=(20, 6), out=5))
    engine = Engine(list(plan.trace), load_policy("chunked"), make_plane(SMALL, num_blocks=96), cfg, sessions=plan)
    result = engine.run()
    assert result.status == "complete"
    check_sessions(result, plan)
    assert len({tuple(r.output_ids) for r in result.requests}) > 1          # the model's own, varied tokens
    assert sum(r.num_cached_tokens_total for r in result.requests) > 0
    last = result.requests[2]
    lone = Engine([TraceRequest(0.0, len(last.prompt_ids), len(last.output_ids),
                                prompt_ids=tuple(int(t) for t in last.prompt_ids))],
                  load_policy("chunked"), make_plane(SMALL, num_blocks=96), cfg).run()
    assert lone.requests[0].output_ids == last.output_ids


def test_users_run_whole_sessions_one_after_another():
    plan = plan_of(chat(n_sessions=6, turns=3), concurrency=2)
    result = closed_loop_run(plan)
    check_sessions(result, plan)
    spans = {}
    for i, r in enumerate(result.requests):
        first, last = spans.get(plan.session[i], (r.arrival_time, r.finish_time))
        spans[plan.session[i]] = (min(first, r.arrival_time), max(last, r.finish_time))
    starts = sorted(a for a, _ in spans.values())
    ends = sorted(b for _, b in spans.values())
    assert starts[:2] == [0.0, 0.0]                              # recorded start times are not used
    assert starts[2:] == pytest.approx(ends[:4])                 # a session starts as one ends


def test_a_run_stopped_midway_keeps_every_turn_finished_rejected_or_unfinished():
    from policylab.analysis.metrics import request_table
    from policylab.core.config import SloConfig

    class StopsLater(PrefillFirst):
        steps = 0

        def schedule(self, view):
            self.steps += 1
            if self.steps > 40:
                raise RuntimeError("policy gave up")
            return super().schedule(view)

    plan = plan_of(chat())
    engine = engine_on(plan.trace, policy=StopsLater(name="stops_later"), sessions=plan)
    result = engine.run()
    assert result.partial and "policy gave up" in result.error
    table = request_table(result, SloConfig())
    assert len(table) == len(plan.trace) and set(table["status"]) <= {"finished", "rejected", "unfinished"}
    assert (table["status"] == "finished").any() and (table["status"] == "unfinished").any()
    assert list(table["session"]) == plan.session and list(table["turn"]) == plan.turn


def test_the_radix_index_sees_the_same_conversation_hits():
    plan = plan_of(chat())
    hashed = closed_loop_run(plan)
    radix = closed_loop_run(plan, dataclasses.replace(CFG, prefix_cache="radix"))
    check_sessions(radix, plan)
    assert [r.num_cached_tokens_total for r in radix.requests] == [r.num_cached_tokens_total for r in hashed.requests]
    assert sum(r.num_cached_tokens_total for r in radix.requests) > 0
