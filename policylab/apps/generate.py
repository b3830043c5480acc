"""`python -m policylab generate`: one real prompt through the full engine and data plane.

The prompt is tokenized with the checkpoint's own tokenizer, replayed as a one-request
trace (same engine, KV manager and policy as a benchmark run), and the output ids are
decoded back to text. Useful as an end-to-end smoke test of a checkpoint.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from policylab.core.config import EngineConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.core.engine import Engine
from policylab.core.request import SamplingParams, TraceRequest


def generate_ids(plane, prompts: list, max_new_tokens: int, sampling: SamplingParams = SamplingParams(),
                 engine_cfg: Optional[EngineConfig] = None, policy=None, seed: int = 0) -> list:
    """Output ids per prompt (all arriving at t=0), through the engine and `plane`."""
    from policies.prefill_first import PrefillFirst
    cfg = engine_cfg or EngineConfig()
    need = max(len(p) for p in prompts) + max_new_tokens
    cfg = dataclasses.replace(cfg, stop_at_eos=True, max_model_len=max(cfg.max_model_len, need))
    trace = [TraceRequest(arrival_time=0.0, prompt_tokens=len(p), output_tokens=max_new_tokens,
                          prompt_ids=tuple(int(t) for t in p)) for p in prompts]
    engine = Engine(trace, policy or PrefillFirst(name="prefill_first"), plane, cfg, seed=seed, sampling=sampling)
    result = engine.run()
    if result.partial:
        raise RuntimeError(f"generation stopped early: {result.error}")
    bad = [r.reject_reason for r in result.requests if r.reject_reason]
    if bad:
        raise ValueError(f"prompt rejected by the engine: {bad[0]}")
    return [list(r.output_ids) for r in result.requests]


def generate_text(model_cfg: ModelConfig, dp_cfg: DataplaneConfig, prompt: str, max_new_tokens: int = 64,
                  temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                  chat: bool = False, engine_cfg: Optional[EngineConfig] = None) -> str:
    """Completion of `prompt` (raw text, or a user turn of the chat template with chat=True)."""
    from transformers import AutoTokenizer

    from policylab.dataplane.torch_plane import TorchDataPlane
    plane = TorchDataPlane.from_config(dp_cfg, model_cfg, seed)
    if plane.checkpoint is None:
        raise ValueError(f"model '{plane.cfg.name}' has random weights and no tokenizer; generate needs a "
                         "checkpoint (model=smollm2-135m, or model.source=hf_dir with model.path=...)")
    tok = AutoTokenizer.from_pretrained(plane.checkpoint)
    if chat:
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                      tokenize=True, return_dict=True)["input_ids"]
    else:
        ids = tok(prompt)["input_ids"]
    if not len(ids):
        raise ValueError("the prompt tokenizes to nothing; give some text")
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    out = generate_ids(plane, [ids], max_new_tokens, sampling, engine_cfg, seed=seed)[0]
    return tok.decode(out, skip_special_tokens=True)
