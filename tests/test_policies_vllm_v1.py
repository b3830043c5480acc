"""vllm_v1: vLLM 0.32's v1 scheduler rules, by hand-worked cases (tests/test_vllm_conformance.py checks
them against vLLM itself where vLLM is installed)."""
import pytest

from policies.chunked import Chunked
from policies.vllm_v1 import VllmV1
from policylab.core.config import EngineConfig
from policylab.core.request import TraceRequest as T
from policylab.testing import Scenario, check_policy
from policylab.testing.replay import replay


def plans(records) -> list:
    return [(r.plan.num_scheduled_tokens, r.plan.preempt) for r in records]


def test_admission_reserves_the_whole_prompt_unless_told_not_to():
    """10 blocks of 16: after A's 40 tokens (3 blocks) 7 are free, B's 150-token prompt needs 10."""
    trace = [T(0.0, 40, 5), T(0.0, 150, 5)]
    cfg = EngineConfig(block_size=16, num_blocks=10, max_num_batched_tokens=64, max_num_seqs=4)
    _, whole = replay(VllmV1(), trace, cfg)
    _, first_chunk = replay(VllmV1(scheduler_reserve_full_isl=False), trace, cfg)
    assert whole[0].plan.num_scheduled_tokens == {0: 40}
    assert first_chunk[0].plan.num_scheduled_tokens == {0: 40, 1: 24}


@pytest.mark.timeout(30)
def test_the_watermark_holds_back_admissions_only_while_a_request_runs():
    """10 blocks of 16, watermark 0.5: int(0.5 x (10 + 1 null block)) = 5 blocks kept free once
    anything runs. With nothing running A's 100-token prompt takes 7 blocks though that leaves only 3
    (vLLM's has_scheduled_reqs); B's 1 block beside it would leave 2 < 5, so B waits for A to finish."""
    trace = [T(0.0, 100, 5), T(0.0, 16, 5)]
    cfg = EngineConfig(block_size=16, num_blocks=10, max_num_batched_tokens=256, max_num_seqs=4)
    reserve = int(0.5 * (cfg.num_blocks + 1))
    a_blocks, b_blocks = -(-100 // 16), 1
    assert a_blocks + reserve > cfg.num_blocks >= a_blocks          # A fits only without the watermark
    assert cfg.num_blocks - a_blocks < b_blocks + reserve           # B beside A breaks it
    _, records = replay(VllmV1(watermark=0.5), trace, cfg)
    assert records[0].plan.num_scheduled_tokens == {0: 100}
    b_starts = next(r for r in records if 1 in r.plan.num_scheduled_tokens)
    assert b_starts.plan.num_scheduled_tokens == {1: 16} and 0 not in b_starts.running


def test_a_chunk_that_does_not_fit_preempts_instead_of_shrinking():
    """9 blocks of 16. Step 2 leaves B 28 tokens in 2 blocks and no block free; step 3 asks B's full
    chunk (63 tokens, 4 more blocks): B, the tail of running, is preempted. chunked shrinks it."""
    trace = [T(0.0, 100, 30), T(0.0, 100, 2)]
    cfg = EngineConfig(block_size=16, num_blocks=9, max_num_batched_tokens=64, max_num_seqs=4)
    _, records = replay(VllmV1(scheduler_reserve_full_isl=False), trace, cfg)
    assert plans(records)[:3] == [({0: 64}, []), ({0: 36, 1: 28}, []), ({0: 1}, [1])]
    _, shrunk = replay(Chunked(chunk_size=None), trace, cfg)
    assert 0 < shrunk[2].plan.num_scheduled_tokens.get(1, 0) < 63 and not shrunk[2].plan.preempt


def test_priority_admits_by_priority_and_preempts_the_largest():
    trace = [T(0.0, 30, 40, priority=2), T(0.0, 30, 40, priority=0), T(0.0, 30, 40, priority=1)]
    cfg = EngineConfig(block_size=16, num_blocks=7, max_num_batched_tokens=64, max_num_seqs=4)
    _, records = replay(VllmV1(policy="priority"), trace, cfg)
    assert records[0].plan.num_scheduled_tokens == {1: 30, 2: 30, 0: 4}     # priorities 0, 1, then 2
    priority = {0: 2, 1: 0, 2: 1}
    preempting = [r for r in records if r.plan.preempt]
    assert preempting
    for r in preempting:                    # the first victim: the largest priority value running
        assert r.plan.preempt[-1] == max(r.running, key=priority.get)


def test_the_long_prefill_threshold_applies_only_when_others_wait_or_run():
    cfg = EngineConfig(block_size=16, num_blocks=100, max_num_batched_tokens=256, max_num_seqs=4)
    _, alone = replay(VllmV1(long_prefill_token_threshold=50), [T(0.0, 200, 2)], cfg)
    _, pair = replay(VllmV1(long_prefill_token_threshold=50), [T(0.0, 200, 2), T(0.0, 200, 2)], cfg)
    assert alone[0].plan.num_scheduled_tokens == {0: 200}
    assert pair[0].plan.num_scheduled_tokens == {0: 50, 1: 50}


def test_without_chunked_prefill_a_prompt_larger_than_the_budget_left_waits():
    cfg = EngineConfig(block_size=16, num_blocks=100, max_num_batched_tokens=256, max_num_seqs=4)
    _, records = replay(VllmV1(enable_chunked_prefill=False), [T(0.0, 200, 2), T(0.0, 100, 2)], cfg)
    assert records[0].plan.num_scheduled_tokens == {0: 200}


@pytest.mark.parametrize("knobs", [dict(policy="lifo"), dict(watermark=1.0), dict(long_prefill_token_threshold=-1),
                                   dict(enable_chunked_prefill="yes"), dict(max_num_partial_prefills=0)])
def test_bad_knobs_are_refused_with_their_name(knobs):
    with pytest.raises(ValueError, match=next(iter(knobs))):
        VllmV1(**knobs)


def test_partial_prefill_cap_limits_unfinished_prompts():
    cfg = EngineConfig(block_size=16, num_blocks=200, max_num_batched_tokens=300, max_num_seqs=4)
    trace = [T(0.0, 500, 2), T(0.0, 500, 2), T(0.0, 500, 2)]
    _, capped = replay(VllmV1(long_prefill_token_threshold=100, max_num_partial_prefills=2), trace, cfg)
    _, free = replay(VllmV1(long_prefill_token_threshold=100), trace, cfg)
    assert capped[0].plan.num_scheduled_tokens == {0: 100, 1: 100}
    assert free[0].plan.num_scheduled_tokens == {0: 100, 1: 100, 2: 100}


def test_invariants_hold_on_a_tight_cache_with_prefix_sharing():
    trace = tuple(T(0.01 * i, 120 + 13 * i, 20, prefix_hashes=(1,) if i % 2 else (), priority=i % 3)
                  for i in range(10))
    for knobs in (dict(), dict(policy="priority", watermark=0.1), dict(scheduler_reserve_full_isl=False,
                                                                      long_prefill_token_threshold=32)):
        check_policy(lambda: VllmV1(**knobs), Scenario(trace, EngineConfig(block_size=16, num_blocks=30,
                                                                          max_num_batched_tokens=128,
                                                                          max_num_seqs=6)))


class _OneByOne:
    """The policy with its bulk running pass declined: every running request served one by one, as
    vLLM's loop does."""

    def __new__(cls, base, **knobs):
        one_by_one = type(f"OneByOne{base.__name__}", (base,), {"_schedule_running_in_bulk": lambda *a: None})
        return one_by_one(**knobs)


class _Paths:
    """Checks every answer of the bulk running pass against vLLM's loop over each running request on
    the same view (the same tokens in the same order, budget and free blocks left, decodes served;
    declined exactly where the loop preempts), and counts which way it went (prefills among the
    decodes, declined for a victim, every request decoding in the view's running order or in an
    order of vLLM's own)."""

    def __init__(self):
        self.mixed = self.declined = self.declined_decoding = 0
        self.orders: set = set()
        self.wrong: list = []

    def wrap(self, policy):
        from policylab import StepPlan
        bulk = policy._schedule_running_in_bulk

        def checked(view, order, threshold):
            out = bulk(view, order, threshold)
            plan = StepPlan()
            budget, free = policy._schedule_running(view, plan, [view.by_id[rid] for rid in order], threshold)
            served = sum(1 for rid, n in plan.num_scheduled_tokens.items() if rid in view.decoding)
            loop = None if plan.preempt else (list(plan.num_scheduled_tokens.items()), budget, free, served)
            if (out and (list(out[0].items()), *out[1:])) != loop:
                self.wrong.append((view.step, out, loop))
            self.declined += out is None
            self.declined_decoding += out is None and not view.prefilling
            self.mixed += out is not None and bool(view.prefilling) and out[3] > 0
            if out is not None and not view.prefilling and len(out[0]) == len(order) > 1:
                self.orders.add(policy._same_order[1])
            return out
        policy._schedule_running_in_bulk = checked
        return policy


def _plans(policy, scenario) -> tuple:
    """Every plan of a checked replay of `scenario`, in full (keys in order), and its fingerprint."""
    import dataclasses
    from policylab.core.engine import Engine
    from policylab.testing.harness import _dataplane, fingerprint

    class Recorder:
        name, features = policy.name, tuple(policy.features)

        def schedule(self, view):
            plan = policy.schedule(view)
            plans.append((list(plan.num_scheduled_tokens.items()), list(plan.preempt), dict(plan.reject),
                          dict(plan.spec_tokens)))
            return plan

        def on_finished(self, view):
            policy.on_finished(view)

    plans: list = []
    try:
        engine = Engine(list(scenario.trace), Recorder(), _dataplane(scenario.seed),
                        dataclasses.replace(scenario.engine, check_invariants=True), seed=scenario.seed,
                        prefix_block_tokens=scenario.prefix_block_tokens)
    except ValueError:             # a combination the engine refuses (forks and beams on every request)
        return None
    return plans, fingerprint(engine.run())


@pytest.mark.timeout(240)
@pytest.mark.parametrize("base", ["vllm_v1", "spec_adaptive"])
def test_running_decodes_served_in_bulk_plan_as_one_by_one(base):
    """Generated scenarios (parallel samples sharing blocks, prefix caching, swap, tiny budgets and
    caches) under every knob: the bulk running pass gives exactly the plans of vLLM's loop over
    each running request, and the replays end alike. The scenarios must take each way the bulk
    pass can go, or the test checks less than it says. (Beams are left out: a beam replacement
    can hand a beam that is recomputing after a preemption to a loser that has decoded, leaving a
    running decode whose block table is shorter than its computed tokens; the engine's own decode
    bookkeeping does not expect that state either.)"""
    import dataclasses

    from hypothesis import HealthCheck, assume, given, settings, strategies as st
    from policies.spec_adaptive import SpecAdaptive
    from policylab.testing.strategies import fork_scenarios
    cls = {"vllm_v1": VllmV1, "spec_adaptive": SpecAdaptive}[base]
    knobs = st.fixed_dictionaries({}, optional={
        "policy": st.sampled_from(["fcfs", "priority"]), "long_prefill_token_threshold": st.sampled_from([0, 1, 7, 64]),
        "enable_chunked_prefill": st.booleans(), "scheduler_reserve_full_isl": st.booleans(),
        "watermark": st.sampled_from([0.0, 0.05]), "max_num_partial_prefills": st.sampled_from([None, 1, 2])})
    paths = _Paths()

    @settings(deadline=None, max_examples=25, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(scenario=fork_scenarios(max_requests=12), knobs=knobs)
    def check(scenario, knobs):
        scenario = dataclasses.replace(scenario, trace=tuple(dataclasses.replace(t, beam_width=1) for t in scenario.trace),
                                       engine=dataclasses.replace(scenario.engine, beam_width=0))
        paths.wrong.clear()
        bulk = _plans(paths.wrap(cls(**knobs)), scenario)
        assume(bulk is not None)
        assert bulk == _plans(_OneByOne(cls, **knobs), scenario)
        assert not paths.wrong, paths.wrong[0]
    check()
    assert paths.mixed and paths.declined and True in paths.orders, vars(paths)


@pytest.mark.timeout(60)
def test_decodes_that_outgrow_the_cache_preempt_the_tail_as_one_by_one():
    """Six requests decoding on a cache that holds half of their outputs: at the step where the
    decodes' new blocks exceed the free ones, the bulk pass declines and vLLM's loop preempts from
    the tail; every plan is the loop's."""
    trace = tuple(T(0.0, 5 + i, 40) for i in range(6))    # block boundaries crossed a step apart
    scenario = Scenario(trace, EngineConfig(block_size=4, num_blocks=36, max_num_batched_tokens=64, max_num_seqs=8))
    paths = _Paths()
    bulk = _plans(paths.wrap(VllmV1()), scenario)
    assert bulk == _plans(_OneByOne(VllmV1), scenario) and not paths.wrong
    assert paths.declined_decoding and any(preempt for _, preempt, _, _ in bulk[0])


@pytest.mark.timeout(60)
def test_decodes_keep_vllms_running_order_where_it_is_not_the_views():
    """Under `policy: priority` vLLM's running order is the order it admitted requests in (by
    priority) while the view's is the waiting queue's: every step's decodes come in vLLM's order,
    in bulk as one by one."""
    trace = (T(0.0, 30, 20, priority=2), T(0.0, 30, 20, priority=0), T(0.0, 30, 20, priority=1))
    scenario = Scenario(trace, EngineConfig(block_size=16, num_blocks=100, max_num_batched_tokens=128, max_num_seqs=4))
    paths = _Paths()
    bulk = _plans(paths.wrap(VllmV1(policy="priority")), scenario)
    assert bulk == _plans(_OneByOne(VllmV1, policy="priority"), scenario) and not paths.wrong
    assert paths.orders == {False}
    assert [rid for rid, _ in bulk[0][1][0]] == [1, 2, 0]       # the first decode step


@pytest.mark.timeout(60)
@pytest.mark.parametrize("threshold, served", [(0, 0), (61, 3), (40, 5)])
def test_a_prefill_ahead_of_decodes_in_vllms_order_leaves_them_the_budget_it_does_not_take(threshold, served):
    """A long prompt admitted before five requests that now decode (vLLM's order; here set by hand)
    takes its chunk first: what is left of the 64-token budget goes to the decodes behind it in
    order, in bulk as one by one."""
    from policylab.core.engine import Engine
    from policylab.testing.harness import _dataplane
    trace = [T(0.0, 4, 30) for _ in range(5)] + [T(0.0, 200, 5)]
    engine = Engine(trace, Chunked(chunk_size=24), _dataplane(0),
                    EngineConfig(block_size=4, num_blocks=200, max_num_batched_tokens=64, max_num_seqs=8))
    engine.begin()
    while len(engine._view().decoding) < 5:
        engine.step()
    view = engine._view()
    (prefill,) = view.prefilling
    decodes = [v.req_id for v in view.running if v.req_id in view.decoding]
    got = []
    for policy in (VllmV1(long_prefill_token_threshold=threshold),
                   _OneByOne(VllmV1, long_prefill_token_threshold=threshold)):
        policy._order = [prefill.req_id, *decodes]
        got.append(policy.schedule(view).num_scheduled_tokens)
    chunk = min(prefill.remaining_tokens, threshold or 64)
    assert list(got[0].items()) == list(got[1].items()) == [(prefill.req_id, chunk)] + [(rid, 1) for rid in decodes[:served]]


class _AfreshEachStep(VllmV1):
    """vllm_v1 told each step by a view built afresh, as the vLLM integration builds it: a new
    running tuple every step, frozen sets of facts (`policylab.integrations.vllm.view.build_view`)."""

    def schedule(self, view):
        from policylab.core.contract import DecodeFacts, SchedulerView
        decoding = frozenset(view.decoding)
        ids = tuple(v.req_id for v in view.running if v.req_id in decoding)
        fresh = SchedulerView(view.clock, view.step, view.waiting, tuple(view.running), decoding,
                              view.max_num_batched_tokens, view.max_num_seqs, view.block_size, view.num_free_blocks,
                              view.num_total_blocks, view.by_id, tuple(view.sampled), tuple(view.arrived),
                              decode=DecodeFacts(frozenset(view.decode_needs_block), ids))
        return super().schedule(fresh)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("knobs", [dict(), dict(policy="priority", long_prefill_token_threshold=16)])
def test_a_view_built_afresh_each_step_plans_alike(knobs):
    """Mixed steps, preemptions and prefix hits on a tight cache: told by views built as the vLLM
    integration builds them (nothing kept between steps is the same object), vllm_v1 plans as it
    does on the engine's own views."""
    trace = tuple(T(0.01 * i, 40 + 13 * i, 30, prefix_hashes=(1,) if i % 2 else (), priority=i % 3) for i in range(12))
    scenario = Scenario(trace, EngineConfig(block_size=8, num_blocks=60, max_num_batched_tokens=96, max_num_seqs=8))
    own = _plans(VllmV1(**knobs), scenario)
    assert own == _plans(_AfreshEachStep(**knobs), scenario)
    assert any(preempt for _, preempt, _, _ in own[0])
