"""Attention kernel times from a Vidur `attention.csv` (one layer, ms), as a function of the batch.

Vidur profiles one layer's attention on a grid (vidur/profiling/attention, docs/profiling.md):
a decode row (`prefill_chunk_size` 0) times `batch_size` requests that each have
`kv_cache_size` tokens cached and add one; a prefill row times one chunk of
`prefill_chunk_size` tokens after `kv_cache_size` cached ones (`batch_size` 1). A row's time is
its kernel (`attn_decode` or `attn_prefill` median) plus, where the file times it, the write of
its new tokens into the paged KV cache (`attn_kv_cache_save`), as Vidur's predictor adds them
(a file without that column, e.g. the FLASH_ATTENTION ones, counts it as 0, as Vidur does).

Vidur fits a random forest to the points; here the time is interpolated piecewise-linearly on
the grid itself: at every profiled point it is the measurement (duplicates averaged), between
two it stays between them, and past the grid it grows in proportion to the work (KV tokens read
by decodes, query-key pairs of a chunk), which a forest does not do. A batch costs its decodes as
one (batch size, mean context) point, as Vidur does, plus each prefill chunk at its (chunk, cached).
"""
from __future__ import annotations

from bisect import bisect_right
from pathlib import Path

import numpy as np

from policylab.core.config import ModelConfig
from policylab.dataplane.profile_csv import ProfileError, floats, read_table, select_tp

SHAPE = {"n_embd": "hidden_size", "n_q_head": "num_attention_heads", "n_kv_head": "num_key_value_heads"}
REQUIRED = ("time_stats.attn_prefill.median", "time_stats.attn_decode.median", "batch_size", "kv_cache_size",
            "prefill_chunk_size", "num_tensor_parallel_workers", *SHAPE)
KV_WRITE = "time_stats.attn_kv_cache_save.median"


class Grid:
    """t(outer, inner) through every point: piecewise linear in `inner` along each profiled `outer`,
    linear in `outer` between the nearest two curves that reach `inner`; past the grid it scales
    with work(outer, inner) from the nearest curve (never down: below the grid it is clamped)."""

    def __init__(self, outer: np.ndarray, inner: np.ndarray, t: np.ndarray, work):
        self.keys, self.curves, self.work = [], [], work
        for key in np.unique(outer):
            rows = outer == key
            xs, inverse = np.unique(inner[rows], return_inverse=True)
            self.keys.append(float(key))
            self.curves.append((xs, np.bincount(inverse, weights=t[rows]) / np.bincount(inverse)))
        self.reach = [xs[-1] for xs, _ in self.curves]

    def _along(self, i: int, inner: float) -> float:
        xs, ys = self.curves[i]
        if inner <= xs[-1]:
            return float(np.interp(inner, xs, ys))
        return float(ys[-1]) * self.work(self.keys[i], inner) / self.work(self.keys[i], xs[-1])

    def __call__(self, outer: float, inner: float) -> float:
        at = bisect_right(self.keys, outer)
        lo = next((i for i in range(at - 1, -1, -1) if self.reach[i] >= inner), None)
        hi = next((i for i in range(at, len(self.keys)) if self.reach[i] >= inner), None)
        if lo is None and hi is None:                   # beyond every curve's reach: the nearest ones, scaled
            lo, hi = (at - 1 if at else None), (at if at < len(self.keys) else None)
        if lo is not None and hi is not None:
            k0, k1 = self.keys[lo], self.keys[hi]
            w = (outer - k0) / (k1 - k0)
            return (1 - w) * self._along(lo, inner) + w * self._along(hi, inner)
        if lo is not None:                                                 # above the grid: scale up
            return self._along(lo, inner) * self.work(outer, inner) / self.work(self.keys[lo], inner)
        return self._along(hi, inner)                                      # below it: clamp


def decode_work(cached: float, batch: float) -> float:
    return batch * (cached + 1)                     # KV tokens read


def prefill_work(chunk: float, cached: float) -> float:
    return chunk * (cached + (chunk + 1) / 2)       # query-key pairs


class ProfiledAttention:
    """Per-layer attention time (s) of a batch (query lengths, context lengths)."""

    def __init__(self, path: Path, model: ModelConfig, tp: int):
        t = read_table(path, REQUIRED)
        for column, field in SHAPE.items():
            if set(map(float, t[column])) != {float(getattr(model, field))}:
                raise ProfileError(f"{path}: {column}={'/'.join(sorted(set(t[column])))} but model.{field}="
                                   f"{getattr(model, field)}: profile of another model shape")
        rows = select_tp(t, tp, path)
        for column in ("block_size", "attention_backend"):
            if column in t and len({v for v, keep in zip(t[column], rows) if keep}) > 1:
                raise ProfileError(f"{path}: several {column} values ({', '.join(sorted(set(t[column])))}): "
                                   "keep the rows of the one your engine uses")
        chunk = floats(t, "prefill_chunk_size", path)
        decode, prefill = rows & (chunk == 0), rows & (chunk > 0)      # Vidur: a decode row has no chunk
        if not prefill.any() or not decode.any():
            raise ProfileError(f"{path}: needs both prefill (prefill_chunk_size > 0) and decode rows "
                               f"for num_tensor_parallel_workers={tp}")

        def seconds(phase: str, which: np.ndarray) -> np.ndarray:
            kernel = floats(t, f"time_stats.attn_{phase}.median", path, which)
            return (kernel + (floats(t, KV_WRITE, path, which) if KV_WRITE in t else 0.0)) / 1e3

        self.decode = Grid(floats(t, "kv_cache_size", path, decode), floats(t, "batch_size", path, decode),
                           seconds("decode", decode), decode_work)
        self.prefill = Grid(floats(t, "prefill_chunk_size", path, prefill), floats(t, "kv_cache_size", path, prefill),
                            seconds("prefill", prefill), prefill_work)

    def __call__(self, q, ctx) -> float:
        cached, t = [], 0.0
        for n, k in zip(q, ctx):
            if n == 1 and k > 0:
                cached.append(k)
            else:
                t += self.prefill(n, k)
        return t + (self.decode(sum(cached) / len(cached), len(cached)) if cached else 0.0)
