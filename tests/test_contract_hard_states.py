"""The KV rules of the contract in the states where they are easy to get wrong: after a preemption,
with prefix-cache hits, with blocks two requests share. Each test builds the state by hand, asks the
view and the validator, and checks the answer against what committing the plan really takes."""
from __future__ import annotations

import numpy as np
import pytest

from policies.chunked import Chunked
from policies.prefill_first import PrefillFirst
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.core.contract import ContractViolation, StepPlan
from policylab.core.engine import Engine
from policylab.core.policy import Policy
from policylab.core.request import TraceRequest
from policylab.dataplane.sim import SimDataPlane
from policylab.testing import Scenario, run_checked


def plane() -> SimDataPlane:
    return SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"))


class Scripted(Policy):
    """Plays `plans[step]` (a function of the view) at each step; records the views."""

    def __init__(self, plans):
        super().__init__("scripted")
        self.plans, self.views = plans, []

    def schedule(self, view):
        self.views.append(view)
        return self.plans[view.step](view)


# Block size 4, 12 blocks. Requests 0, 1 and 2 share an 8-token (2-block) prefix; request 3 has a
# prompt of its own of 9 blocks.
SHARED = [TraceRequest(0.0, 12, 20, prefix_hashes=(7,)), TraceRequest(0.0, 12, 20, prefix_hashes=(7,)),
          TraceRequest(0.0, 12, 20, prefix_hashes=(7,)), TraceRequest(0.0, 36, 2)]
CFG = EngineConfig(block_size=4, num_blocks=12, max_num_batched_tokens=64, max_num_seqs=4)


def shared_prefix_engine(third_plan) -> Engine:
    """Step 0 prefills request 0 (3 blocks, the first 2 the shared prefix, published); step 1
    decodes it (a 4th block) and starts request 1 on its 2 cache hits (+1 block): 7 blocks free,
    2 held by both. Step 2 plays `third_plan`."""
    plans = [lambda v: StepPlan({0: 12}),
             lambda v: StepPlan({0: 1, 1: v.by_id[1].remaining_tokens}),
             third_plan]
    engine = Engine(SHARED, Scripted(plans), plane(), CFG, prefix_block_tokens=8)
    engine.step()
    engine.step()
    r0, r1 = engine.requests[0], engine.requests[1]
    assert r0.block_table[:2] == r1.block_table[:2], "the two requests share their prefix blocks"
    assert (len(r0.block_table), len(r1.block_table), engine.kv.num_free) == (4, 3, 7)
    return engine


def test_preempting_a_request_frees_only_the_blocks_nobody_else_holds():
    """Preempting request 0 frees its 2 own blocks, not the 2 it shares with request 1: a plan that
    needs 10 blocks after that preemption (9 are there) is refused, and nothing is committed."""
    engine = shared_prefix_engine(lambda v: StepPlan({2: 4, 3: 36}, preempt=[0]))
    view = engine._view()
    assert view.blocks_freed_by_preempting(view.by_id[0]) == 2
    assert view.plan_kv(StepPlan(preempt=[0])) == (0, 9)
    assert view.plan_kv(StepPlan({2: 4, 3: 36}, preempt=[0])) == (10, 9)   # 2 hits held by 1: + 1, + 9
    before = (engine.kv.num_free, [r.status for r in engine.requests], engine.requests[0].num_computed_tokens)
    with pytest.raises(ContractViolation) as caught:
        engine.step()
    assert caught.value.rule == "kv_capacity"
    assert (engine.kv.num_free, [r.status for r in engine.requests], engine.requests[0].num_computed_tokens) == before


def test_a_preemption_that_gives_exactly_enough_blocks_is_committed():
    engine = shared_prefix_engine(lambda v: StepPlan({2: 4, 3: 32}, preempt=[0]))
    assert engine._view().plan_kv(StepPlan({2: 4, 3: 32}, preempt=[0])) == (9, 9)
    engine.step()
    assert engine.kv.num_free == 0 and engine.requests[0].status.value == "waiting"


def test_a_chunk_longer_than_what_the_cache_leaves_is_refused_and_the_request_is_untouched():
    """Request 2 would reuse 2 cached blocks (8 tokens): at most 4 of its 12 prompt tokens are left
    to compute. A chunk of 12 (the bound without the cache hits) breaks chunk_bounds."""
    engine = shared_prefix_engine(lambda v: StepPlan({2: 12}))
    view = engine._view()
    assert view.by_id[2].num_cached_tokens == 8 and view.by_id[2].remaining_tokens == 4
    before = (engine.kv.num_free, engine.requests[2].num_computed_tokens, list(engine.requests[2].block_table))
    with pytest.raises(ContractViolation) as caught:
        engine.step()
    assert caught.value.rule == "chunk_bounds" and "allowed 1..4" in caught.value.detail
    after = (engine.kv.num_free, engine.requests[2].num_computed_tokens, list(engine.requests[2].block_table))
    assert after == before


def test_a_plan_that_fits_exactly_with_cache_hits_on_held_blocks_is_accepted():
    """Request 2's 2 cache hits are blocks request 1 holds: they take no free block, so request 2
    (1 block) beside request 3 (6 blocks) uses exactly the 7 free blocks, and is valid."""
    engine = shared_prefix_engine(lambda v: StepPlan({2: 4, 3: 24}))
    view = engine._view()
    assert view.plan_kv(StepPlan({2: 4, 3: 24})) == (7, 7)
    assert view.blocks_needed(view.by_id[2], 4) == 1
    engine.step()
    assert engine.kv.num_free == 0 and engine.requests[2].num_cached_tokens_total == 8


class Exact(Chunked):
    """chunked, noting each plan's (needed, available) to compare with what its commit takes."""

    def __init__(self):
        super().__init__(chunk_size=48)
        self.noted = []

    def schedule(self, view):
        plan = super().schedule(view)
        self.noted.append(view.plan_kv(plan))
        return plan


def test_plan_kv_equals_what_the_commit_takes_in_every_state_of_a_tight_replay():
    """Over a replay that preempts, hits the prefix cache and shares blocks, each plan's counted KV
    is exactly what committing it took: free blocks after the commit = available - needed."""
    rng = np.random.default_rng(11)
    trace = [TraceRequest(float(t), int(p), int(o), prefix_hashes=((7,), (7, 8), ())[k % 3])
             for k, (t, p, o) in enumerate(zip(np.sort(rng.uniform(0, 0.05, 40)), rng.integers(20, 90, 40),
                                               rng.integers(10, 60, 40)))]
    policy = Exact()
    engine = Engine(trace, policy, plane(), EngineConfig(block_size=8, num_blocks=48, max_num_batched_tokens=96,
                                                         max_num_seqs=12), prefix_block_tokens=16)
    execute, after_commit = engine.dataplane.execute, []
    engine.dataplane.execute = lambda batch: (after_commit.append(engine.kv.num_free), execute(batch))[1]
    result = engine.run()
    assert result.status == "complete", result.error
    assert len(after_commit) == len(policy.noted)    # (every plan of this replay ran a batch)
    assert [available - needed for needed, available in policy.noted] == after_commit
    preempted = sum(r.num_preemptions for r in result.requests)
    cached = sum(r.num_cached_tokens_total for r in result.requests)
    assert preempted > 3 and cached > 0


def test_output_is_capped_at_max_tokens_checked_against_the_request():
    """max_tokens=5 on a request whose trace output is 50: it generates 5 (the harness checks the
    count against the request's max_tokens and the trace, not the engine's own target)."""
    trace = (TraceRequest(0.0, 20, 50, max_tokens=5), TraceRequest(0.0, 20, 3, max_tokens=5),
             TraceRequest(0.01, 20, 50))
    result = run_checked(PrefillFirst, Scenario(trace, EngineConfig(block_size=8, num_blocks=64, max_tokens=9)))
    assert [len(r.output_ids) for r in result.requests] == [5, 3, 9]


def test_cached_token_total_counts_every_hit_of_a_request():
    """Request 1 hits the shared 8-token prefix block, is preempted (its own blocks published), and
    on its return hits its 2 prompt blocks: 8 + 16 cached tokens over its life."""
    trace = [TraceRequest(0.0, 16, 30, prefix_hashes=(7,)), TraceRequest(0.0, 16, 30, prefix_hashes=(7,))]
    plans = [lambda v: StepPlan({0: 16}),
             lambda v: StepPlan({0: 1, 1: v.by_id[1].remaining_tokens}),
             lambda v: StepPlan({0: 1}, preempt=[1]),
             lambda v: StepPlan({0: 1, 1: v.by_id[1].remaining_tokens})]
    engine = Engine(trace, Scripted(plans), plane(), EngineConfig(block_size=8, num_blocks=20),
                    prefix_block_tokens=8)
    for _ in plans:
        engine.step()
    r = engine.requests[1]
    assert r.num_preemptions == 1 and r.num_computed_tokens == 17
    assert r.num_cached_tokens_total == 8 + 16
