"""Scheduling may change timing, never content: every shipped policy yields the same greedy
output tokens per request on the real data plane (chunks, prefix hits and preemptions included).

The real plane computes the tokens and the sim's cost model times the steps
(`dataplane.step_time=model`), so which requests have arrived at each decision, and hence the
preemptions this test needs, do not depend on the machine's speed."""
from __future__ import annotations

import numpy as np
import pytest

from policylab.core.config import EngineConfig, HardwareConfig
from policylab.dataplane import build_dataplane
from policylab.core.engine import Engine
from policylab.core.request import Status, TraceRequest
from policylab.testing.loader import load_policy, shipped_policy_configs, spec_id
from tests.test_dataplane_model import SMALL, dataplane

# mixed lengths, staggered arrivals, two requests sharing a 32-token prefix, two clients
TRACE = [TraceRequest(arrival_time=t, prompt_tokens=p, output_tokens=o, client=c, prefix_hashes=h)
         for t, p, o, c, h in ((0.0, 40, 6, "a", (7,)), (0.0, 9, 8, "b", ()), (0.001, 36, 5, "a", (7,)),
                               (0.002, 23, 7, "b", ()), (0.05, 5, 9, "a", ()), (0.05, 30, 4, "b", (7,)))]
CFG = EngineConfig(block_size=4, num_blocks=24, max_num_batched_tokens=32, max_num_seqs=4,
                   max_model_len=128, check_invariants=True)


@pytest.fixture(scope="module")
def plane():
    # 4 ms per step on top of the kernels' few microseconds: the staggered arrivals land mid-replay
    return build_dataplane(dataplane(step_time="model"), SMALL, HardwareConfig(step_overhead=0.004), seed=0)


def outputs(plane, policy) -> tuple:
    engine = Engine(TRACE, policy, plane, CFG, seed=0, prefix_block_tokens=32)
    result = engine.run()
    assert result.status == "complete", result.error
    assert all(r.status is Status.FINISHED for r in result.requests)
    return [list(r.output_ids) for r in result.requests], sum(r.num_preemptions for r in result.requests)


def test_every_shipped_policy_produces_the_same_tokens(plane):
    reference, _ = outputs(plane, load_policy("prefill_first"))
    assert [len(o) for o in reference] == [t.output_tokens for t in TRACE]
    preemptions = 0
    for spec in shipped_policy_configs():
        got, preempted = outputs(plane, load_policy(spec))
        preemptions += preempted
        assert got == reference, f"{spec_id(spec)} changed the generated tokens"
    assert preemptions > 0, "no policy preempted: the KV cache is too large to exercise recompute"


def test_modelled_step_times_make_the_schedule_machine_independent(plane):
    """Same trace twice, one replay slowed down: identical step records, each step timed by the model."""
    import time
    fast = Engine(TRACE, load_policy("chunked"), plane, CFG, seed=0, prefix_block_tokens=32).run()
    execute = plane.plane.execute
    plane.plane.execute = lambda batch: (time.sleep(0.002), execute(batch))[1]
    try:
        slow = Engine(TRACE, load_policy("chunked"), plane, CFG, seed=0, prefix_block_tokens=32).run()
    finally:
        plane.plane.execute = execute
    assert fast.steps.keys() == slow.steps.keys()            # (typed columns: numpy arrays)
    assert all(np.array_equal(fast.steps[k], slow.steps[k]) for k in fast.steps)
    assert [r.output_ids for r in fast.requests] == [r.output_ids for r in slow.requests]
    assert min(fast.steps["duration"]) >= HardwareConfig().step_overhead      # the sim's, not measured
