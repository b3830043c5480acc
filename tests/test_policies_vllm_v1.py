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
