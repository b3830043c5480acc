"""Every rule of the step contract: a plan that breaks it raises ContractViolation naming the
rule and the policy, and the engine changes nothing (DESIGN §3: never silently fixed)."""
import copy
import inspect
import re

import numpy as np
import pytest

from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.core.contract import ContractViolation, RequestView, StepPlan
from policylab.core.plan_rules import validate_plan
from policylab.dataplane.sim import SimDataPlane
from policylab.core.engine import Engine
from policylab.core.policy import Policy
from policylab.core.request import Request, TraceRequest

# After the first step request 0 (8-token prompt) is decoding and holds 2 of 6 blocks;
# requests 1 (8 tokens) and 2 (20 tokens) wait. Budget 24 tokens, at most 2 requests.
TRACE = [TraceRequest(0.0, 8, 4), TraceRequest(0.0, 8, 4), TraceRequest(0.0, 20, 4)]
CFG = EngineConfig(block_size=4, num_blocks=6, max_num_batched_tokens=24, max_num_seqs=2)

BAD_PLANS = {
    "plan_type": lambda: None,
    "unique": lambda: StepPlan(preempt=[0, 0]),
    "preempt_running": lambda: StepPlan(preempt=[1]),
    "preempted_scheduled": lambda: StepPlan({0: 1}, preempt=[0]),
    "reject_waiting": lambda: StepPlan(reject={0: "too late"}),
    "rejected_scheduled": lambda: StepPlan({1: 8}, reject={1: "too late"}),
    "reject_reason": lambda: StepPlan(reject={1: ""}),
    "seq_cap": lambda: StepPlan({0: 1, 1: 8, 2: 8}),
    "unknown_request": lambda: StepPlan({99: 1}),
    "chunk_type": lambda: StepPlan({1: np.int64(8)}),
    "decode_one": lambda: StepPlan({0: 2}),
    "chunk_bounds": lambda: StepPlan({1: 9}),
    "token_budget": lambda: StepPlan({1: 8, 2: 20}),
    "kv_capacity": lambda: StepPlan({2: 20}),
}


class Scripted(Policy):
    """Prefill request 0 in the first step, then return the plan under test."""

    def __init__(self, bad_plan):
        super().__init__("scripted")
        self.bad_plan = bad_plan

    def schedule(self, view):
        return StepPlan({0: 8}) if view.step == 0 else self.bad_plan()


def engine_after_first_step(bad_plan) -> Engine:
    dataplane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"))
    engine = Engine(TRACE, Scripted(bad_plan), dataplane, CFG)
    engine.step()
    assert [r.req_id for r in engine.running] == [0] and engine.views[0].is_decode
    return engine


def state(engine: Engine) -> tuple:
    requests = [(r.req_id, r.status, r.num_computed_tokens, len(r.output_ids)) for r in engine.requests]
    return engine.kv.num_free, engine.clock.now, requests


@pytest.mark.parametrize("rule", sorted(BAD_PLANS))
def test_each_broken_rule_is_named_and_nothing_is_committed(rule):
    engine = engine_after_first_step(BAD_PLANS[rule])
    before = state(engine)
    with pytest.raises(ContractViolation) as caught:
        engine.step()
    assert (caught.value.rule, caught.value.policy) == (rule, "scripted")
    assert "scripted" in str(caught.value) and rule in str(caught.value)
    assert state(engine) == before


def test_every_rule_of_validate_plan_has_a_breaking_plan():
    from policylab.core import plan_rules
    source = inspect.getsource(plan_rules.check_plan) + inspect.getsource(plan_rules._check_entries)
    rules = set(re.findall(r'ContractViolation\(policy, "(\w+)"', source))
    assert rules == set(BAD_PLANS)


@pytest.mark.parametrize("count", [True, 1.0, np.int64(1)])
def test_a_decode_count_equal_to_but_not_the_int_1_breaks_chunk_type(count):
    """The steady-state check (every count is the int 1) must not let lookalikes through."""
    engine = engine_after_first_step(lambda: StepPlan({0: count}))
    with pytest.raises(ContractViolation) as caught:
        engine.step()
    assert caught.value.rule == "chunk_type"


def test_chunk_bounds_rejects_an_empty_chunk_too():
    engine = engine_after_first_step(lambda: StepPlan({1: 0}))
    with pytest.raises(ContractViolation, match="chunk_bounds"):
        engine.step()


def test_empty_plan_with_running_requests_breaks_work_conservation():
    engine = engine_after_first_step(StepPlan)
    with pytest.raises(ContractViolation) as caught:
        engine.step()
    assert (caught.value.rule, caught.value.policy) == ("work_conservation", "scripted")


def test_run_reports_a_violation_as_a_partial_result():
    dataplane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"))
    result = Engine(TRACE, Scripted(BAD_PLANS["decode_one"]), dataplane, CFG).run()
    assert result.partial and "decode_one" in result.error and "scripted" in result.error
    assert sum(r is not None and r.status.value == "finished" for r in result.requests) == 0


def test_views_never_expose_the_true_output_length():
    exposed = {name for name in dir(RequestView) if not name.startswith("_")}
    assert not any("output_tokens" == n or "target" in n for n in exposed)
    assert "output_tokens" not in Request.__dataclass_fields__


def test_the_view_carries_each_engine_fact_in_its_own_field():
    """The engine builds the view positionally (hot path); every field must hold its own fact."""
    engine = engine_after_first_step(lambda: StepPlan({0: 1}))
    engine.step()                     # request 0 decodes into a third block: 9 of 12 slots used
    engine.step_index = 7
    engine.clock.now = 0.5
    view = engine._view()
    assert (view.clock, view.step) == (0.5, 7)
    assert [v.req_id for v in view.waiting] == [1, 2] and [v.req_id for v in view.running] == [0]
    assert (view.max_num_batched_tokens, view.max_num_seqs, view.block_size) == (24, 2, 4)
    assert (view.num_free_blocks, view.num_total_blocks) == (3, 6)
    assert view.blocks_needed(view.by_id[1], 8) == 2
    assert view.blocks_freed_by_preempting(view.by_id[0]) == 3
    assert view.plan_kv(StepPlan({1: 8})) == (2, 3)
    assert sorted(view.by_id) == [0, 1, 2] and set(view.decoding) == {0}
    assert view.decode_blocks_needed == 0 and view.decode_tokens() == {0: 1}
    with pytest.raises(AttributeError):
        view.max_num_batched_tokens = 10 ** 9       # read-only: the engine checks against its own
    tokens = view.decode_tokens()
    tokens[1] = 8                                   # a new dict each call: the policy's own
    assert view.decode_tokens() == {0: 1}


def test_a_plan_kept_from_an_earlier_step_is_checked_like_any_plan():
    """A plan of decodes kept from an earlier step (here naming a request that has finished since)
    goes through every check and breaks a rule."""
    kept = []

    class Hoarder(Policy):
        def schedule(self, view):
            if view.waiting:
                return StepPlan({v.req_id: v.remaining_tokens for v in view.waiting[:2]})
            kept.append(view.decode_tokens())
            return StepPlan(kept[0])

    dataplane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"))
    trace = [TraceRequest(0.0, 8, 2), TraceRequest(0.0, 8, 9)]
    result = Engine(trace, Hoarder("hoarder"), dataplane, CFG).run()
    assert result.partial and "unknown_request" in result.error
    assert [len(r.output_ids) for r in result.requests] == [2, 2]


def test_the_verdict_and_kv_count_of_a_plan_do_not_depend_on_its_order():
    """The engine finds a plan's decodes by their keys: chunked's plans (decodes first, then prefill
    chunks) get the same KV count and verdict with the chunks first, and a decode given 2 tokens, or
    a chunk that is too long, breaks its rule in either order."""
    from policies.chunked import Chunked

    checked = []

    class Checking(Chunked):
        def schedule(self, view):
            plan = super().schedule(view)
            sched = plan.num_scheduled_tokens
            k = sum(rid in view.decoding for rid in sched)
            if k and len(sched) > k and not plan.preempt:
                chunks_first = StepPlan(dict([*list(sched.items())[k:], *list(sched.items())[:k]]))
                assert view.plan_kv(plan) == view.plan_kv(chunks_first)
                assert validate_plan(view, plan, "c") is None and validate_plan(view, chunks_first, "c") is None
                first_decode, chunk = next(iter(sched)), list(sched)[k]
                for order in (plan, chunks_first):
                    with pytest.raises(ContractViolation, match="decode_one"):
                        validate_plan(view, StepPlan({**order.num_scheduled_tokens, first_decode: 2}), "c")
                    with pytest.raises(ContractViolation, match="chunk_bounds"):
                        validate_plan(view, StepPlan({**order.num_scheduled_tokens, chunk: 10 ** 6}), "c")
                checked.append(k)
            return plan

    rng = np.random.default_rng(0)
    trace = [TraceRequest(float(t), int(p), int(o)) for t, p, o in
             zip(np.sort(rng.uniform(0, 0.1, 40)), rng.integers(30, 300, 40), rng.integers(20, 120, 40))]
    dataplane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"))
    cfg = EngineConfig(block_size=8, num_blocks=400, max_num_batched_tokens=96, max_num_seqs=16)
    assert Engine(trace, Checking(chunk_size=64), dataplane, cfg).run().status == "complete"
    assert len(checked) > 20 and max(checked) > 3


def test_the_design_notes_policy_example_runs_and_keeps_every_invariant():
    """The 20-line policy of docs/design.md §3 is the whole API a policy author needs: it runs to
    completion under the invariant harness, with preemptions, on a cache too small for its load."""
    from pathlib import Path

    from policylab.testing import Scenario, run_checked

    text = (Path(__file__).resolve().parents[1] / "docs" / "design.md").read_text()
    source = next(block for block in text.split("```python\n")[1:] if "class ShortestPromptFirst" in block)
    namespace: dict = {}
    exec(source.split("```")[0], namespace)
    rng = np.random.default_rng(3)
    trace = tuple(TraceRequest(float(t), int(p), int(o)) for t, p, o in
                  zip(np.sort(rng.uniform(0, 0.2, 30)), rng.integers(10, 120, 30), rng.integers(5, 60, 30)))
    cfg = EngineConfig(block_size=8, num_blocks=40, max_num_batched_tokens=128, max_num_seqs=8)
    result = run_checked(lambda: namespace["ShortestPromptFirst"]("spf"), Scenario(trace, cfg), properties=False)
    assert all(r.status.value == "finished" for r in result.requests)
    assert sum(r.num_preemptions for r in result.requests) > 0
