"""A vLLM engine in this process, and the tiny random Llama it runs: the vLLM side of the
conformance checks and of the tests that drive a whole vLLM engine (needs `vllm` importable;
imported lazily)."""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from typing import Optional

_MODEL_DIR: Optional[str] = None


def tiny_llama_dir() -> str:
    """A tiny random Llama's config (and, for the full engine, weights) saved as an HF directory."""
    global _MODEL_DIR
    if _MODEL_DIR is None:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
        path = tempfile.mkdtemp(prefix="policylab-tiny-llama-")
        config = LlamaConfig(vocab_size=32000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1 << 15)
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(path)
        _MODEL_DIR = path
    return _MODEL_DIR


@contextmanager
def vllm_engine(**engine_args):
    """`vllm.LLM(**engine_args)` in this process, shut down when the block ends, failing or not.

    An in-process engine's teardown resets vLLM's process-wide parallel groups. Left to the
    garbage collector (an engine a failed test's traceback keeps alive), it would run under the
    next engine and remove that one's groups: so every engine is shut down before the next starts.
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM
    llm = LLM(**engine_args)
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
