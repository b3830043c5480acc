"""The default model vLLM serves here: policylab's `tiny` Llama shape with seeded random weights,
written once as a Hugging Face directory (`save_pretrained`) under ~/.cache/policylab (no hub).

Same shape as configs/model/tiny.yaml, so the simulator's `model=tiny` prices the very model
vLLM runs; random weights are enough for scheduling (every request is replayed with
`ignore_eos` for its trace length).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from policylab.core.config import ModelConfig

CACHE_ENV = "POLICYLAB_CACHE"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "policylab")


def tiny_shape() -> ModelConfig:
    """configs/model/tiny.yaml's shape (kept in step by tests/test_vllm_scheduler_adapter.py)."""
    return ModelConfig(name="tiny", hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                       num_attention_heads=6, num_key_value_heads=2, vocab_size=8192,
                       max_position_embeddings=8192, tie_word_embeddings=True)


def tiny_model_dir(shape: ModelConfig | None = None, seed: int = 0, root: Path | None = None) -> Path:
    """The HF directory of a random-weight Llama of `shape` (default: tiny), made on first use."""
    shape = shape or tiny_shape()
    key = f"{shape.hidden_size}x{shape.num_hidden_layers}-h{shape.num_attention_heads}-kv{shape.num_key_value_heads}" \
          f"-v{shape.vocab_size}-s{seed}"
    path = (root or cache_root()) / f"vllm-random-llama-{key}"
    if (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
                         intermediate_size=shape.intermediate_size, num_hidden_layers=shape.num_hidden_layers,
                         num_attention_heads=shape.num_attention_heads, num_key_value_heads=shape.num_key_value_heads,
                         max_position_embeddings=shape.max_position_embeddings, rope_theta=shape.rope_theta,
                         rms_norm_eps=shape.rms_norm_eps, tie_word_embeddings=shape.tie_word_embeddings,
                         torch_dtype="float32")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    (tmp / "policylab_shape.json").write_text(json.dumps(asdict(shape), indent=1))
    try:
        tmp.rename(path)
    except OSError:              # another process wrote it first
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return path
