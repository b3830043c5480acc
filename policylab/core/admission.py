"""What the engine decides about a request when it arrives, before any policy sees it (DESIGN §3).

Shared by the engine (reject with a reason) and the cluster router (a replica that can never
hold a request must not be chosen for it), so both say the same thing.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from policylab.core.config import EngineConfig
from policylab.core.kv import blocks_for


def never_fits(prompt_tokens: int, output_tokens: int, max_model_len: int, num_blocks: int,
               block_size: int, max_tokens: Optional[int] = None, stop_at_limit: bool = False) -> str:
    """Why a request can never run on an engine with this context length and KV cache ("" if it can):
    prompt + the tokens it will generate, its output capped at `max_tokens` (the request's or the
    engine's cap, when one is set). `stop_at_limit` (vLLM's way): a prompt shorter than
    max_model_len runs, its output stopped where the two reach it (`output_cap`)."""
    if max_tokens:
        output_tokens = min(output_tokens, max_tokens)
    if stop_at_limit:
        if prompt_tokens >= max_model_len:
            return f"prompt ({prompt_tokens}) tokens reach max_model_len={max_model_len}: no room for an output token"
        output_tokens = min(output_tokens, max_model_len - prompt_tokens)
    total = prompt_tokens + output_tokens
    if total > max_model_len:
        return (f"prompt ({prompt_tokens}) + output ({output_tokens}) tokens exceed "
                f"max_model_len={max_model_len}")
    need = blocks_for(total, block_size)
    if need > num_blocks:
        return f"needs {need} KV blocks, the whole cache has {num_blocks}"
    return ""


def output_cap(prompt_tokens: int, max_model_len: int, stop_at_limit: bool):
    """The most output tokens a request may generate before its length reaches max_model_len when
    the engine stops it there (`engine.length_limit=stop`); None when it is rejected instead."""
    return max(max_model_len - prompt_tokens, 0) if stop_at_limit else None


def predict_output(cfg: EngineConfig, rng: np.random.Generator, true_len: int) -> Optional[int]:
    """The output length shown to policies: none, or the truth with optional lognormal noise."""
    if cfg.predictor == "none":
        return None
    if cfg.predictor != "oracle":
        raise ValueError(f"engine.predictor must be 'none' or 'oracle', got '{cfg.predictor}'")
    noise = rng.lognormal(0.0, cfg.predictor_noise) if cfg.predictor_noise else 1.0
    return max(1, round(true_len * noise))
