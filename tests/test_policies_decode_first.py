"""decode_first: request-level batching (FasterTransformer), optionally filling free slots."""
import pytest

from policies.decode_first import DecodeFirst
from policylab.core.config import EngineConfig
from policylab.core.request import TraceRequest as T
from policylab.testing.replay import replay

CFG = EngineConfig(block_size=16, num_blocks=200, max_num_batched_tokens=128, max_num_seqs=4,
                   enable_prefix_caching=False)
TRACE = [T(0.0, 50, 20), T(0.0, 50, 5), T(0.001, 50, 5), T(0.002, 60, 3)]


def test_new_requests_wait_until_the_batch_drains():
    result, records = replay(DecodeFirst(), TRACE, CFG)
    first_batch_done = max(result.requests[0].finish_time, result.requests[1].finish_time)
    assert result.requests[2].first_scheduled_time >= first_batch_done
    assert result.requests[3].first_scheduled_time >= first_batch_done
    assert not [r for r in records if r.running and set(r.waiting) & set(r.plan.num_scheduled_tokens)]


def test_free_slots_mode_admits_into_a_running_batch_and_keeps_decoding():
    result, records = replay(DecodeFirst(admit_into_free_slots=True), TRACE, CFG)
    assert result.requests[2].first_scheduled_time < result.requests[0].finish_time
    for r in records:                     # every running decode keeps its token
        decodes = [rid for rid, is_decode in r.running.items() if is_decode]
        assert all(rid in r.plan.num_scheduled_tokens or rid in r.plan.preempt for rid in decodes)


def test_prompts_are_admitted_whole():
    _, records = replay(DecodeFirst(admit_into_free_slots=True), TRACE, CFG)
    prompt = {i: t.prompt_tokens for i, t in enumerate(TRACE)}
    for r in records:
        for rid in set(r.waiting) & set(r.plan.num_scheduled_tokens):
            assert r.plan.num_scheduled_tokens[rid] == prompt[rid]


def test_an_oversized_prompt_runs_alone_in_budget_chunks():
    trace = [T(0.0, 300, 3), T(0.0, 20, 3)]
    result, records = replay(DecodeFirst(), trace, CFG)
    chunks = [r.plan.num_scheduled_tokens[0] for r in records if 0 in r.plan.num_scheduled_tokens
              and not r.running.get(0, False)]
    assert chunks == [128, 128, 44]
    assert result.requests[1].first_scheduled_time >= result.requests[0].finish_time
    assert all(r.status.value == "finished" for r in result.requests)


def test_rejects_a_non_boolean_switch():
    with pytest.raises(ValueError, match="admit_into_free_slots"):
        DecodeFirst(admit_into_free_slots="yes")
