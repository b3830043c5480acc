"""Attention kernel times from a Vidur `attention.csv` (one layer, ms), as a function of the batch.

Vidur times decode attention by (`batch_size`, `kv_cache_size` per request) and prefill attention
by (`prefill_chunk_size`, `kv_cache_size` already cached), and fits a random forest over them.
Attention's cost is its work, so here each phase is a non-negative least-squares line in the
work the roofline also counts: decode time = a + b·Σ KV tokens read; a prefill chunk's time =
c + d·chunk + e·chunk·(cached + chunk/2) (query-key pairs), summed over the batch's chunks.
A line cannot follow a kernel's tile steps, but it extrapolates sanely, which a forest does not.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from policylab.core.config import ModelConfig
from policylab.dataplane.profile_csv import ProfileError, floats, read_table, select_tp

SHAPE = {"n_embd": "hidden_size", "n_q_head": "num_attention_heads", "n_kv_head": "num_key_value_heads"}
REQUIRED = ("time_stats.attn_prefill.median", "time_stats.attn_decode.median", "batch_size", "kv_cache_size",
            "prefill_chunk_size", "is_prefill", "num_tensor_parallel_workers", *SHAPE)


class ProfiledAttention:
    """Per-layer attention time (s) of a batch (query lengths, context lengths)."""

    def __init__(self, path: Path, model: ModelConfig, tp: int):
        t = read_table(path, REQUIRED)
        for column, field in SHAPE.items():
            if set(map(float, t[column])) != {float(getattr(model, field))}:
                raise ProfileError(f"{path}: {column}={'/'.join(sorted(set(t[column])))} but model.{field}="
                                   f"{getattr(model, field)}: profile of another model shape")
        rows = select_tp(t, tp, path)
        prefill = np.array([v.strip().lower() in ("true", "1") for v in t["is_prefill"]]) & rows
        decode = ~prefill & rows
        if not prefill.any() or not decode.any():
            raise ProfileError(f"{path}: needs both prefill (is_prefill=True) and decode rows "
                               f"for num_tensor_parallel_workers={tp}")
        batch, kv = floats(t, "batch_size", path, decode), floats(t, "kv_cache_size", path, decode)
        self.decode_w = self._fit(np.stack([np.ones(len(batch)), batch * kv], 1),
                                  floats(t, "time_stats.attn_decode.median", path, decode) / 1e3)
        c, k = floats(t, "prefill_chunk_size", path, prefill), floats(t, "kv_cache_size", path, prefill)
        self.prefill_w = self._fit(np.stack([np.ones(len(c)), c, c * (k + c / 2)], 1),
                                   floats(t, "time_stats.attn_prefill.median", path, prefill) / 1e3)

    @staticmethod
    def _fit(X: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Relative-error weighting: short and long batches count alike."""
        return nnls(X / y[:, None], np.ones(len(y)))[0]

    def __call__(self, q, ctx) -> float:
        a, b = self.decode_w
        c, d, e = self.prefill_w
        kv_read, decodes, t = 0, 0, 0.0
        for n, k in zip(q, ctx):
            if n == 1 and k > 0:
                kv_read, decodes = kv_read + k + 1, decodes + 1
            else:
                t += c + d * n + e * n * (k + n / 2)
        return t + (a + b * kv_read if decodes else 0.0)
