"""`dataplane.attention=triton`: paged attention in Triton kernels reading the block table directly.

Same interface as the backends of attention.py: `plan` once per step, `forward` per layer
(write this step's K/V, then attend over the paged context). Decodes (one query) go to the
decode kernel, longer chunks to the prefill kernel, in one pass each. A decode-only step's
plan is the packed tensors themselves (no host-to-device copy, no new shapes), which is what
lets the CUDA-graph runner capture it: `graph_safe_decode`.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from policylab.dataplane import triton_kernels as kernels
from policylab.dataplane.packing import PackedInput


def check_runnable(device: torch.device) -> None:
    """Triton kernels need a GPU, or Triton's interpreter on CPU (tests)."""
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"dataplane.attention=triton runs on CUDA (on CPU only under Triton's interpreter, "
                         f"TRITON_INTERPRET=1, for tests); this run uses device '{device}'. "
                         "Use dataplane.attention=torch")


class TritonAttention:
    name = "triton"
    kv_layout = "block_major"
    graph_safe_decode = True

    def __init__(self, device: torch.device):
        on_gpu = device.type == "cuda"
        self.block_m = 64 if on_gpu else 16      # small tiles keep the interpreter quick on CPU
        self.block_n = 32 if on_gpu else 16
        self.decode_block_n = None if on_gpu else 16     # None: sized by the kernel wrapper

    def plan(self, packed: PackedInput, cache_shape: tuple) -> dict:
        is_decode = packed.query_lens == 1
        if is_decode.all():                      # rows 0..B-1 in order: graph-capturable
            return {"decode": (None, packed.block_tables, packed.seq_lens)}
        dev, meta = packed.input_ids.device, {}
        if is_decode.any():
            idx = torch.from_numpy(np.nonzero(is_decode)[0]).to(dev)
            rows = packed.cu_seqlens_q[idx].long()
            meta["decode"] = (rows, packed.block_tables[idx], packed.seq_lens[idx])
        sel = np.nonzero(~is_decode)[0]
        per_entry = np.stack([packed.query_starts[sel], packed.query_lens[sel], packed.context_lens[sel]])
        starts, lens, ctx = torch.from_numpy(per_entry.astype(np.int32)).to(dev)
        meta["prefill"] = (packed.block_tables[torch.from_numpy(sel).to(dev)], starts, lens, ctx,
                           int(packed.query_lens[sel].max()))
        return meta

    def forward(self, q, k, v, k_cache, v_cache, packed: PackedInput, meta: dict) -> torch.Tensor:
        kernels.store_kv(k, v, k_cache, v_cache, packed.slot_mapping)
        q = q.contiguous()
        out = torch.empty_like(q)
        if "prefill" in meta:
            tables, starts, lens, ctx, max_q = meta["prefill"]
            kernels.paged_prefill(q, out, k_cache, v_cache, tables, starts, lens, ctx, max_q,
                                  block_m=self.block_m, block_n=self.block_n)
        if "decode" in meta:
            rows, tables, seq_lens = meta["decode"]
            if rows is None:
                kernels.paged_decode(q, out, k_cache, v_cache, tables, seq_lens, block_n=self.decode_block_n)
            else:
                decoded = q.new_empty((len(rows), *q.shape[1:]))
                kernels.paged_decode(q[rows], decoded, k_cache, v_cache, tables, seq_lens,
                                     block_n=self.decode_block_n)
                out[rows] = decoded
        return out
