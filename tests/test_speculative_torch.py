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
