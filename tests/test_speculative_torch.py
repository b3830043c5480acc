"""Speculative decoding on the torch plane: n-gram (prompt-lookup) drafts verified greedily by the
real model emit exactly the tokens of plain greedy decoding, with measured (not modelled)
acceptance."""
from __future__ import annotations

import pytest

from policies.prefill_first import PrefillFirst
from policylab.core.config import EngineConfig
from policylab.core.engine import Engine
from policylab.core.request import TraceRequest
from policylab.core.speculative_plan import FixedSpeculation
from policylab.dataplane.torch_plane import TorchDataPlane
from tests.test_dataplane_model import SMALL, dataplane

pytestmark = pytest.mark.timeout(300)


def replay(policy, trace):
    plane = TorchDataPlane.from_config(dataplane(), SMALL, seed=0)
    cfg = EngineConfig(block_size=4, num_blocks=128, max_num_batched_tokens=64, max_num_seqs=8,
                       max_model_len=256, check_invariants=True)
    engine = Engine(trace, policy, plane, cfg, seed=0)
    result = engine.run()
    assert result.status == "complete", result.error
    return engine, result


def test_ngram_speculation_equals_plain_greedy_decoding():
    pattern = [11, 12, 13, 14, 15, 16]            # repeated phrases give the lookup matches to draft from
    trace = [TraceRequest(0.0, 6 * n + 3, 24, prompt_ids=tuple(pattern * n + [7 + n, 8, 9]))
             for n in (2, 3, 4)] + [TraceRequest(0.0, 10, 20)]
    _, plain = replay(PrefillFirst(), trace)
    engine, spec = replay(FixedSpeculation(PrefillFirst(), 3), trace)
    assert [r.output_ids for r in spec.requests] == [r.output_ids for r in plain.requests]
    stats = engine.extension("speculation").stats
    assert stats["proposed_tokens"] > 0 and stats["accepted_tokens"] > 0        # real acceptance, measured
    assert stats["accepted_tokens"] + stats["rejected_tokens"] == stats["proposed_tokens"]
    assert len(spec.steps["clock"]) < len(plain.steps["clock"])
    assert engine.kv.num_free == engine.kv.num_blocks


@pytest.mark.timeout(60)
def test_beams_score_the_token_a_verification_samples_with_its_own_log_probability():
    """Beam search asks the plane for the log-probabilities of each step's sampled tokens. After a
    verification the sampled token of an entry with drafts comes from the row after its accepted
    drafts, and of a plain entry from its last row: the plane answers from those rows of this step
    (not from an earlier step's logits), equal to log_softmax of a forward over the same batch."""
    import torch
    pattern = [11, 12, 13, 14, 15, 16]
    trace = [TraceRequest(0.0, 15, 16, prompt_ids=tuple(pattern * 2 + [9, 8, 7]), beam_width=2),
             TraceRequest(0.0, 10, 12)]
    plane = TorchDataPlane.from_config(dataplane(), SMALL, seed=0)
    checked, execute = [], plane.execute

    def execute_and_check(batch):
        result = execute(batch)
        if batch.spec_lens is not None and any(batch.spec_lens):
            logits = plane.forward(batch, all_logits=True)      # the same KV again: the same logits
            starts = [sum(batch.query_lens[:i]) for i in range(len(batch.query_lens))]
            rows = [starts[i] + (len(result.accepted[i]) if batch.spec_lens[i] else batch.query_lens[i] - 1)
                    for i, s in enumerate(batch.sample) if s]
            want = torch.log_softmax(logits[rows].float(), -1)[torch.arange(len(rows)), result.sampled]
            got = plane.sampled_logprobs(list(range(len(rows))), list(result.sampled))
            assert got == pytest.approx(want.tolist(), abs=1e-5)
            checked.append(len(rows))
        return result

    plane.execute = execute_and_check
    cfg = EngineConfig(block_size=4, num_blocks=128, max_num_batched_tokens=64, max_num_seqs=8,
                       max_model_len=256, check_invariants=True)
    engine = Engine(trace, FixedSpeculation(PrefillFirst(), 3), plane, cfg, seed=0)
    result = engine.run()
    assert result.status == "complete", result.error
    assert checked and engine.extension("speculation").stats["accepted_tokens"] > 0
    assert result.sections["forks"]["beam_requests"] == 1
    _, plain = replay(PrefillFirst(), [TraceRequest(0.0, 15, 16, prompt_ids=trace[0].prompt_ids), trace[1]])
    beams = (result.requests[0], *result.requests[0].forks)
    assert all(b.output_ids == plain.requests[0].output_ids for b in beams)      # greedy: every beam alike
