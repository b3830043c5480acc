"""`engine.publish_on_schedule`: a prompt's full blocks enter the prefix cache when they are
scheduled (vLLM's way), so a request admitted later in the same step hits a prefix still being
computed. The plan's KV cost is unchanged, the tokens a real model produces are unchanged, and
vllm_v1 turns it on (tests/test_vllm_conformance.py checks it against vLLM's own scheduler)."""
from __future__ import annotations

import dataclasses

import pytest

from policies.chunked import Chunked
from policies.vllm_v1 import VllmV1
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig, check_engine_config
from policylab.core.contract import StepPlan
from policylab.core.engine import Engine
from policylab.core.policy import Policy
from policylab.core.request import TraceRequest as T
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.sim import SimDataPlane

pytestmark = pytest.mark.timeout(60)

BS = 16
SYSTEM = tuple(range(500, 500 + 4 * BS))              # a system prompt of four blocks


def burst(n: int = 6, own: int = 20, outputs: int = 4) -> list:
    """`n` requests at t=0, each the system prompt then `own + 3i` tokens of its own."""
    return [T(0.0, len(SYSTEM) + own + 3 * i, outputs,
              prompt_ids=SYSTEM + tuple(1000 * (i + 1) + k for k in range(own + 3 * i))) for i in range(n)]


def sim_engine(trace, policy, publish, **engine):
    cfg = EngineConfig(block_size=BS, num_blocks=64, max_num_batched_tokens=2048, max_num_seqs=16,
                       publish_on_schedule=publish, check_invariants=True, **engine)
    return Engine(trace, policy, SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim")), cfg)


def first_step(trace, policy, publish):
    engine = sim_engine(trace, policy, publish)
    engine.step()
    return engine


def in_first_view(trace, publish, ask):
    """What `ask(view)` answers inside vllm_v1's first schedule() call (a view is live: its facts
    are those of the step it is given for)."""
    answers = []

    class Asking(VllmV1):
        def schedule(self, view):
            if not answers:
                answers.append(ask(view))
            return super().schedule(view)

    first_step(trace, Asking(), publish)
    return answers[0]


def test_requests_admitted_with_the_one_computing_a_shared_prompt_hit_it_in_that_step():
    on, off = first_step(burst(), VllmV1(), True), first_step(burst(), VllmV1(), False)
    first = [r.num_cached_tokens_total for r in on.requests]
    assert first == [0] + [len(SYSTEM)] * 5              # the first computes it, the five others reuse it
    assert [r.num_cached_tokens_total for r in off.requests] == [0] * 6
    prefill = lambda e: e.step_log.columns()["prefill_tokens"][0]   # noqa: E731
    assert prefill(off) - prefill(on) == 5 * len(SYSTEM)
    a = on.requests[0].block_table[:4]
    assert all(r.block_table[:4] == a for r in on.requests[1:])   # the same physical blocks
    assert on.kv.num_used == off.kv.num_used - 5 * 4                # and none taken twice


def remainders(view):
    """B's remainder after nothing, after A's whole prompt, after A's first 2.2 blocks; the blocks
    of A and B in one plan and apart."""
    a, b = view.waiting
    after_a = StepPlan({a.req_id: a.remaining_tokens})
    rest = view.remaining_tokens_after(after_a, b)
    both = StepPlan({a.req_id: a.remaining_tokens, b.req_id: rest})
    return (b.prompt_len, view.remaining_tokens_after(StepPlan({}), b), rest,
            view.remaining_tokens_after(StepPlan({a.req_id: 2 * BS + 3}), b),
            view.plan_kv(both)[0], view.blocks_needed(a, a.remaining_tokens) + view.blocks_needed(b, rest))


def test_the_policy_sees_the_smaller_remainder_and_the_plan_costs_the_same_blocks():
    prompt, nothing, after_a, after_part, together, apart = in_first_view(burst(2), True, remainders)
    assert nothing == prompt and after_a == prompt - len(SYSTEM) and after_part == prompt - 2 * BS
    assert together == apart                              # the shared blocks cost no free block
    assert in_first_view(burst(2), False, remainders)[2] == prompt


def test_a_policy_that_asks_for_a_chunk_takes_only_the_hits_its_chunk_leaves_room_for():
    """A plan written without the setting stays valid: a starting request given n tokens takes the
    same-step blocks only while its n tokens still end at or before its last prompt token."""
    class AllAtOnce(Policy):
        def schedule(self, view):
            plan = view.decode_tokens()
            for v in view.waiting:
                plan[v.req_id] = v.remaining_tokens if v.req_id == 0 else 30
            return StepPlan(plan)

    engine = first_step(burst(3), AllAtOnce("all"), True)
    a, b, c = engine.requests
    for r in (b, c):                                     # 84 / 87 tokens: 30 fit after 3 shared blocks
        assert r.num_cached_tokens_total == 3 * BS and r.num_computed_tokens == 3 * BS + 30
        assert r.block_table[:3] == a.block_table[:3]
    whole = first_step(burst(2), type("Whole", (AllAtOnce,), {"schedule": lambda s, view: StepPlan(
        {v.req_id: v.remaining_tokens for v in view.waiting})})("whole"), True)
    assert whole.requests[1].num_cached_tokens_total == 0     # its whole prompt asked: no room for hits


@pytest.mark.parametrize("policy", [VllmV1, lambda: Chunked(chunk_size=48)])
def test_every_request_finishes_with_the_kv_accounted_under_chunks_and_tight_kv(policy):
    trace = burst(10, own=30, outputs=12) + [dataclasses.replace(t, arrival_time=0.5) for t in burst(4)]
    engine = sim_engine(trace, policy(), True)
    result = engine.run()
    assert result.status == "complete", result.error
    assert all(len(r.output_ids) == t.output_tokens for r, t in zip(result.requests, trace))
    assert engine.kv.num_free == engine.kv.num_blocks
    assert sum(r.num_cached_tokens_total for r in result.requests) >= 9 * len(SYSTEM)


def test_vllm_v1_turns_it_on_and_a_run_can_turn_it_off():
    from policylab.apps.engine_build import with_policy_defaults
    from policylab.apps.config import RunConfig
    on = with_policy_defaults(RunConfig(), VllmV1())
    assert on.engine.publish_on_schedule is True
    off = with_policy_defaults(dataclasses.replace(RunConfig(), engine=EngineConfig(publish_on_schedule=False)),
                               VllmV1())
    assert off.engine.publish_on_schedule is False
    assert with_policy_defaults(RunConfig(), Chunked()).engine.publish_on_schedule is None   # (off)


def test_a_value_that_is_not_a_boolean_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="engine.publish_on_schedule must be true or false"):
        check_engine_config(EngineConfig(publish_on_schedule="yes"))


@pytest.mark.timeout(240)
def test_a_real_model_reads_the_blocks_written_in_the_same_step_and_samples_the_same_tokens():
    """On the torch plane a request starting on blocks another request writes in the same forward
    pass reads the K/V just written: its greedy tokens equal those of a run that recomputes them."""
    from policylab.dataplane.torch_plane import TorchDataPlane
    from tests.test_dataplane_model import SMALL, dataplane

    def run(publish):
        trace = [T(0.0, len(p), 8, prompt_ids=p) for p in
                 (tuple(range(40, 56)) + (7, 8, 9), tuple(range(40, 56)) + (3, 4), tuple(range(40, 56)) + (5,))]
        plane = TorchDataPlane.from_config(dataplane(), SMALL, seed=0)
        cfg = EngineConfig(block_size=4, num_blocks=64, max_num_batched_tokens=64, max_num_seqs=8,
                           max_model_len=128, publish_on_schedule=publish, check_invariants=True)
        result = Engine(trace, VllmV1(), plane, cfg, seed=0).run()
        assert result.status == "complete", result.error
        return result

    on, off = run(True), run(False)
    assert [r.num_cached_tokens_total for r in on.requests] == [0, 16, 16]
    assert sum(r.num_cached_tokens_total for r in off.requests) == 0
    assert [r.output_ids for r in on.requests] == [r.output_ids for r in off.requests]
