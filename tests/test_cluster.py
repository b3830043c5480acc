"""The cluster loop (policylab.cluster): one replica replays exactly as the engine, the cluster
invariants hold on generated scenarios for every router, with and without P/D (also with a step
policy of its own in each P/D pool), the replica-by-replica loop of load-blind routers replays
the turn-by-turn loop's steps, and rejections, heterogeneous replicas, the routing contract and
a policy that raises mid-run behave as documented."""
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.prefill_first import PrefillFirst
from policies.routers.least_loaded import LeastLoaded
from policies.routers.power_of_two import PowerOfTwo
from policies.routers.prefix_affinity import PrefixAffinity
from policies.routers.random import RandomRouter
from policies.routers.round_robin import RoundRobin
from policies.routers.session import Session
from policylab import CapacityView, Router
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.core.engine import Engine
from policylab.core.contract import StepPlan
from policylab.core.request import TraceRequest
from policylab.dataplane.sim import SimDataPlane
from policylab.testing import fingerprint
from policylab.testing.cluster import build_cluster, check_cluster
from policylab.testing.replay import SCENARIO_HARDWARE, scenario_dataplane
from policylab.testing.strategies import scenarios

ROUTERS = [RoundRobin, RandomRouter, LeastLoaded, PowerOfTwo, PrefixAffinity, Session]
CFG = EngineConfig(num_blocks=64, block_size=16, max_num_batched_tokens=512, max_num_seqs=16)


def poisson_trace(n=60, rate=20.0, prompt=(40, 300), output=(2, 40), seed=3, prefixes=((), (7,), (7, 8))):
    import numpy as np
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    return [TraceRequest(round(float(a), 6), int(rng.integers(*prompt)), int(rng.integers(*output)),
                         client=f"c{k % 3}", prefix_hashes=prefixes[k % len(prefixes)]) for k, a in enumerate(t)]


@pytest.mark.parametrize("policy", ["prefill_first", "chunked", "fairness"])
def test_one_replica_replays_exactly_as_the_engine(policy):
    trace = poisson_trace(80, rate=60.0)
    plane = SimDataPlane(ModelConfig(), SCENARIO_HARDWARE, scenario_dataplane(SCENARIO_HARDWARE))
    from policylab.testing.loader import policy_factory
    alone = Engine(trace, policy_factory(policy)(), plane, CFG, prefix_block_tokens=32).run()
    cluster = build_cluster(trace, policy, RoundRobin, CFG, replicas=1).run()
    assert alone.status == cluster.status == "complete"
    assert fingerprint(alone)[0] == fingerprint(cluster)[0]
    steps = {k: list(v) for k, v in cluster.steps.items() if k != "replica"}
    assert steps == {k: list(v) for k, v in alone.steps.items()}     # (the engine's are numpy columns)


@given(scenarios(max_requests=16), st.sampled_from(ROUTERS), st.sampled_from([(2, 0, 0), (3, 0, 0), (0, 1, 1), (0, 2, 1)]),
       st.sampled_from(["prefill_first", "chunked", "decode_first", "slo_aware"]))
def test_cluster_invariants_on_generated_scenarios(scenario, router, shape, policy):
    replicas, prefill, decode = shape
    check_cluster(lambda: build_cluster(scenario.trace, policy, router, scenario.engine, replicas=replicas,
                                        prefill=prefill, decode=decode, seed=scenario.seed,
                                        prefix_block_tokens=scenario.prefix_block_tokens, checked=True))


@given(scenarios(max_requests=16), st.sampled_from(ROUTERS), st.sampled_from([(1, 1), (2, 1), (1, 2)]),
       st.sampled_from(["prefill_first", "chunked", "fairness"]),
       st.sampled_from(["decode_first", "chunked", "slo_aware", "prefill_first"]))
def test_cluster_invariants_with_a_policy_per_pool(scenario, router, shape, prefill_policy, decode_policy):
    prefill, decode = shape
    result = check_cluster(lambda: build_cluster(scenario.trace, "sjf", router, scenario.engine, prefill=prefill,
                                                 decode=decode, seed=scenario.seed, checked=True,
                                                 prefix_block_tokens=scenario.prefix_block_tokens,
                                                 prefill_policy=prefill_policy, decode_policy=decode_policy))
    assert [p.policy for p in result.replicas] == [prefill_policy] * prefill + [decode_policy] * decode


def test_round_robin_spreads_and_session_sticks():
    trace = poisson_trace(30)
    rr = build_cluster(trace, "prefill_first", RoundRobin, CFG, replicas=3).run()
    assert rr.placement["replica"] == [k % 3 for k in range(30)]
    trace = [dataclasses.replace(t, arrival_time=0.0) if k < 3 else t for k, t in enumerate(trace)]
    sticky = build_cluster(trace, "prefill_first", Session, CFG, replicas=3).run()
    homes = {}
    for t, k in zip(sticky.trace, sticky.placement["replica"]):
        assert homes.setdefault(t.client, k) == k
    assert sorted(homes.values()) == [0, 1, 2]    # three clients at once: the least loaded each time


def test_prefix_affinity_follows_the_cache_and_raises_the_hit_rate():
    shared = [TraceRequest(0.5 * k, 200, 4, prefix_hashes=(1, 2, 3)) for k in range(12)]
    runs = {r.__name__: build_cluster(shared, "prefill_first", r, CFG, replicas=3).run()
            for r in (RoundRobin, PrefixAffinity)}
    assert runs["PrefixAffinity"].placement["replica"] == [0] * 12     # all follow the first one's blocks
    hits = {k: sum(r.num_cached_tokens_total for r in v.requests) for k, v in runs.items()}
    assert hits["PrefixAffinity"] > hits["RoundRobin"] > 0


def test_least_loaded_and_power_of_two_avoid_the_busy_replica():
    trace = [TraceRequest(0.0, 500, 300)] + [TraceRequest(0.001 * k, 30, 2) for k in range(1, 9)]
    cfg = dataclasses.replace(CFG, predictor="oracle")      # the long decode's remainder is known
    ll = build_cluster(trace, "prefill_first", LeastLoaded, cfg, replicas=2).run()
    assert ll.placement["replica"][0] == 0 and set(ll.placement["replica"][1:]) == {1}
    p2 = [build_cluster(trace, "prefill_first", PowerOfTwo, cfg, replicas=2, seed=s).run().placement["replica"]
          for s in (0, 0)]
    assert p2[0] == p2[1] and set(p2[0][1:]) == {1}      # two replicas: both always drawn


def test_heterogeneous_replicas_and_rejection_when_nothing_fits():
    big = HardwareConfig()
    small = dataclasses.replace(big, name="a100")
    trace = [TraceRequest(0.0, 100, 4), TraceRequest(0.1, 5000, 10), TraceRequest(0.2, 100, 4)]
    cfg = dataclasses.replace(CFG, num_blocks=None, max_model_len=4096)
    result = build_cluster(trace, "prefill_first", RoundRobin, cfg, replicas=2, hardware=[big, small]).run()
    assert [r.status.value for r in result.requests] == ["finished", "rejected", "finished"]
    assert "no replica can ever hold it" in result.requests[1].reject_reason
    assert [p.hardware for p in result.replicas] == ["h100", "a100"]


class Stubborn(Router):
    def __init__(self, answer):
        super().__init__("stubborn")
        self.answer = answer

    def route(self, request, view):
        return self.answer


@pytest.mark.parametrize("answer, rule", [(7, "unknown_replica"), ("0", "route_type"), (1, "never_fits")])
def test_validate_route_names_the_router_and_the_rule(answer, rule):
    plane_blocks = [64, 4]                       # replica 1 can never hold a 100-token request
    trace = [TraceRequest(0.0, 100, 4)]
    cluster = build_cluster(trace, "prefill_first", lambda: Stubborn(answer), CFG, replicas=2)
    cluster.replicas[1].engine.kv.num_blocks = plane_blocks[1]
    result = cluster.run()
    assert result.partial and result.error.startswith(f"RouteViolation: router 'stubborn' broke rule '{rule}'")


@pytest.mark.parametrize("router", [RoundRobin, RandomRouter])
@pytest.mark.parametrize("policy", ["prefill_first", "chunked", "fairness"])
def test_replicas_replayed_one_after_another_equal_the_turn_by_turn_loop(router, policy, monkeypatch):
    """A router that reads no load lets the cluster replay each replica through a stretch of
    arrivals on its own (`_loop_by_replica`); the same router made to look load-reading takes
    the turn-by-turn loop. Same placements, requests and steps, a rejection included, over
    stretches short enough that each replica's share spans several of them."""
    trace = poisson_trace(90, rate=80.0) + [TraceRequest(1.3, 5000, 4)]     # (one no replica can hold)
    turn_by_turn = type("LoadReading", (router,), {"reads_load": True})
    monkeypatch.setattr("policylab.cluster.driver.Cluster.STRETCH", 7)
    runs = [build_cluster(trace, policy, r, CFG, replicas=3).run() for r in (router, turn_by_turn)]
    by_replica, turns = runs
    assert by_replica.status == turns.status == "complete"
    assert by_replica.placement == turns.placement and -1 in by_replica.placement["replica"]
    assert fingerprint(by_replica) == fingerprint(turns)
    assert {k: list(v) for k, v in by_replica.steps.items()} == {k: list(v) for k, v in turns.steps.items()}


class LoadBlind(Router):
    """Declares that it reads no load, then reads a waiting count."""
    reads_load = False

    def route(self, request, view):
        return min(view.replicas, key=lambda r: r.num_waiting).index


def test_a_router_that_declares_it_reads_no_load_may_not_read_it():
    result = build_cluster(poisson_trace(10), "prefill_first", lambda: LoadBlind("blind"), CFG, replicas=2).run()
    assert result.partial and result.error.startswith("RouteViolation: router 'blind' broke rule 'reads_load'")
    assert "'num_waiting'" in result.error
    view = CapacityView(build_cluster(poisson_trace(2), "prefill_first", RoundRobin, CFG).views[0], "blind")
    assert not hasattr(view, "no_such_field") and view.num_total_blocks == CFG.num_blocks   # (not load)


class FailsLate(PrefillFirst):
    """prefill_first until its 40th schedule() call, then raises (a policy bug mid-run)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def schedule(self, view):
        self.calls += 1
        if self.calls == 40:
            raise RuntimeError("policy bug")
        return super().schedule(view)


@pytest.mark.parametrize("router", [RoundRobin, LeastLoaded])
def test_a_policy_that_raises_ends_the_cluster_run_partial_with_what_finished_kept(router):
    """Replica by replica (round_robin) as turn by turn (least_loaded): the run ends partial with
    the policy's error; the requests that finished before it keep their results."""
    result = build_cluster(poisson_trace(60, rate=40.0), FailsLate, router, CFG, replicas=2).run()
    assert result.partial and "RuntimeError: policy bug" in result.error
    finished = [r for r in result.requests if r is not None and r.status.value == "finished"]
    assert 0 < len(finished) < 60 and all(r.token_times and r.finish_time for r in finished)


def first_step_end(trace, replicas: int) -> float:
    """When replica 0's first step ends (its first request's first token) for `trace`."""
    return build_cluster(trace, "prefill_first", RoundRobin, CFG, replicas=replicas).run().requests[0].token_times[0]


@pytest.mark.parametrize("reads_load", [False, True], ids=["by_replica", "turn_by_turn"])
def test_an_arrival_exactly_at_a_step_start_is_admitted_before_that_step(reads_load):
    """Arrivals win ties: a request arriving at the very instant replica 0's next step starts is in
    that step (as `Engine.run` admits arrivals at or before a step's start), in either loop, with
    the invariants checked after every turn; the loop ends (a tie must not spin it)."""
    router = type("Router", (RoundRobin,), {"reads_load": reads_load})
    head = [TraceRequest(0.0, 64, 6), TraceRequest(0.0, 64, 6)]
    tie = first_step_end(head, replicas=2)
    trace = head + [TraceRequest(tie, 48, 4), TraceRequest(tie, 48, 4)]
    result = check_cluster(lambda: build_cluster(trace, "prefill_first", router, CFG, replicas=2, checked=True))
    assert result.status == "complete"
    assert [result.placement["replica"][i] for i in range(4)] == [0, 1, 0, 1]
    assert result.requests[2].first_scheduled_time == tie == result.requests[0].token_times[0]
    plane = SimDataPlane(ModelConfig(), SCENARIO_HARDWARE, scenario_dataplane(SCENARIO_HARDWARE))
    alone = Engine([trace[0], trace[2]], PrefillFirst(), plane, CFG, prefix_block_tokens=32).run()
    assert alone.requests[1].first_scheduled_time == tie    # the engine's own rule, for comparison


@pytest.mark.parametrize("reads_load", [False, True], ids=["by_replica", "turn_by_turn"])
def test_a_loop_that_cannot_progress_stops_with_an_error_instead_of_spinning(reads_load, monkeypatch):
    """A replica whose step runs nothing and moves no clock while it has work would make either loop
    spin at one instant forever: the liveness check ends the run partial, naming the replica."""
    monkeypatch.setattr("policylab.cluster.driver.Cluster.MAX_IDLE_TURNS", 50)
    router = type("Router", (RoundRobin,), {"reads_load": reads_load})
    cluster = build_cluster(poisson_trace(12), "prefill_first", router, CFG, replicas=2)
    stuck = cluster.replicas[1].engine
    stuck.step = lambda: None                 # has work, never runs it
    result = cluster.run()
    assert result.partial and "no progress" in result.error and "replica 1" in result.error


class Pairs(PrefillFirst):
    """With nothing running, requests 0, 1, 4, 5, 8, ... wait alone for the next request, unless they
    have waited 5 ms: a policy whose plan depends on the clock while it waits."""

    def schedule(self, view):
        if not view.running and len(view.waiting) == 1 and view.waiting[0].req_id % 4 < 2 \
                and view.clock < view.waiting[0].arrival_time + 0.005:
            return StepPlan()
        return super().schedule(view)


def test_a_waiting_replica_sleeps_until_its_next_delivery_in_either_loop():
    """A replica whose policy waits wakes at its next delivery, whichever loop runs the cluster, so
    even a policy that would act on the clock alone replays step for step the same in both (it is
    not asked again at other replicas' step times)."""
    import numpy as np
    rng = np.random.default_rng(2)
    arrivals = np.cumsum(rng.exponential(0.03, 24))
    trace = [TraceRequest(round(float(t), 6), int(p), 8) for t, p in zip(arrivals, rng.integers(20, 120, 24))]
    runs = [build_cluster(trace, Pairs, type("R", (RoundRobin,), {"reads_load": reads}), CFG, replicas=2).run()
            for reads in (False, True)]
    by_replica, turns = runs
    assert by_replica.status == turns.status == "complete", (by_replica.error, turns.error)
    assert fingerprint(by_replica) == fingerprint(turns)
    assert {k: list(v) for k, v in by_replica.steps.items()} == {k: list(v) for k, v in turns.steps.items()}
    # requests wait for their pair: the second of each pair on a replica starts both
    firsts = [r.first_scheduled_time for r in by_replica.requests]
    assert firsts[0] == firsts[2] == trace[2].arrival_time


def test_a_replica_left_waiting_when_nothing_more_can_come_breaks_work_conservation():
    """At the end, with nothing left to arrive, a sleeping replica is woken; a policy that still
    waits breaks work_conservation (named, the run partial), in either loop."""
    class Never(PrefillFirst):
        def schedule(self, view):
            return StepPlan() if not view.running else super().schedule(view)
    for reads in (False, True):
        result = build_cluster(poisson_trace(6), Never, type("R", (RoundRobin,), {"reads_load": reads}), CFG,
                               replicas=2).run()
        assert result.partial and "work_conservation" in result.error
