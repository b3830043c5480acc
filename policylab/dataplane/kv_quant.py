"""An FP8 KV cache on the real plane (`dataplane=torch kv_dtype=fp8`): K and V stored in FP8.

Each cached (token, KV head) row is head_dim FP8 (E4M3) values and the float32 scale they were
divided by (amax / 448 of that row), packed in one uint8 row of head_dim + 4 bytes. Per-token,
per-head scales need no calibration and never re-quantise a row (a block's later tokens bring
their own scales): what FP8 storage costs is E4M3's 3 mantissa bits, measured by the plane's
quality reference (`quality.*` in summary.json). The cache is one uint8 tensor of the torch
backend's head-major layout, so block copies (forks), exports (P/D) and swaps move the scales
with the values; the step's new K/V are written encoded, and the attention reads the blocks it
gathers back decoded, in the compute dtype.

The same memory holds 4 x head_dim / (head_dim + 4) times the float32 cache's blocks on CPU
(3.6x for the tiny model's 32-dim heads), 2 x head_dim / (head_dim + 4) times a 16-bit one.
"""
from __future__ import annotations

import torch

from policylab.dataplane.attention import CUDA_SDPA_BACKENDS, TorchAttention, head_major
from policylab.dataplane.packing import PackedInput

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
SCALE_BYTES = 4                 # a float32 scale per (token, head) row
TINY = 1e-12


def row_width(head_dim: int) -> int:
    """Bytes of one cached (token, head) row: the values and their scale."""
    return head_dim + SCALE_BYTES


def encode(x: torch.Tensor) -> torch.Tensor:
    """[n, D] values -> [n, D + 4] uint8 rows: FP8 values, then the float32 scale's bytes."""
    scale = x.abs().amax(-1, keepdim=True).float().clamp(min=TINY) / FP8_MAX
    values = (x.float() / scale).to(FP8).view(torch.uint8)
    return torch.cat((values, scale.view(torch.uint8)), dim=-1)


def decode(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., D + 4] uint8 rows -> [..., D] values in `dtype`."""
    dim = rows.shape[-1] - SCALE_BYTES
    scale = rows[..., dim:].contiguous().view(torch.float32)
    return (rows[..., :dim].view(FP8).float() * scale).to(dtype)


def make_kv_backend(name: str, device: torch.device, kv_cache_dtype: str):
    """The attention backend of a plane whose KV cache is `kv_cache_dtype` (auto: attention.make_backend's)."""
    from policylab.dataplane.attention import make_backend
    if kv_cache_dtype == "auto":
        return make_backend(name, device)
    if name != "torch":
        raise ValueError(f"dataplane.kv_cache_dtype={kv_cache_dtype} is stored by the torch attention backend "
                         f"only; dataplane.attention={name} reads a 16-bit cache (use dataplane.attention=torch)")
    return Fp8KVAttention()


class Fp8KVAttention(TorchAttention):
    """The torch backend over the packed FP8 cache (module doc); plans as it does."""
    kv_dtype = "fp8"

    def forward(self, q, k, v, k_cache, v_cache, packed: PackedInput, meta: dict) -> torch.Tensor:
        k_phys, v_phys = head_major(k_cache), head_major(v_cache)      # uint8 [KVH, blocks, bs, D + 4]
        width, dim = k_phys.shape[-1], q.shape[-1]
        for phys, new in ((k_phys, k), (v_phys, v)):
            phys.view(-1, width).index_copy_(0, meta["write"], encode(new.transpose(0, 1).reshape(-1, dim)))
        if q.is_cuda:
            from torch.nn.attention import sdpa_kernel
            with sdpa_kernel(CUDA_SDPA_BACKENDS):
                return self._attend(q, k_phys, v_phys, meta["groups"], decode)
        return self._attend(q, k_phys, v_phys, meta["groups"], decode)
