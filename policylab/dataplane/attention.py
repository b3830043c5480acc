"""Paged attention backends behind one interface, chosen by `dataplane.attention`.

A backend `plan`s once per step (metadata shared by every layer), then each layer
calls `forward(q, k, v, k_cache, v_cache, packed, meta)`: the new K/V are written at their
slots first, then every query attends causally over its whole context (cached prefix,
earlier chunks, this chunk) read back from the paged cache. Every backend sees caches of
flash-attn's paged shape [num_blocks, block_size, kv_heads, head_dim]; `kv_layout` says
which memory order it wants underneath (TorchDataPlane.allocate_kv honours it).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from policylab.core.kv import blocks_for
from policylab.dataplane.packing import PackedInput


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store this step's K/V ([T, kv_heads, head_dim]) at their flat slots (block-major caches)."""
    k_cache.view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v)


def head_major(cache: torch.Tensor) -> torch.Tensor:
    """[num_blocks, bs, kv_heads, D] view of a head-major cache -> its storage [kv_heads, blocks, bs, D]."""
    phys = cache.permute(2, 0, 1, 3)
    if not phys.is_contiguous():
        raise ValueError("the torch attention backend needs the head-major KV cache of allocate_kv")
    return phys


# SDPA's cuDNN kernel builds an execution plan for every new shape, a large cost per call. A paged
# batch brings new shapes every step as contexts grow, so on
# CUDA the torch backend keeps SDPA to the shape-agnostic kernels.
CUDA_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class _Group:
    """Entries attended together, padded to the group's longest chunk and context."""
    size: int                     # entries
    max_q: int                    # longest chunk (queries per entry after padding)
    rows: torch.Tensor | None     # [G, max_q] flat rows (padding repeats a last row); None: all, in order
    gather: torch.Tensor          # [G * KVH * max_blocks] rows of the (head, block) view to read
    num_keys: int                 # longest context in the group (keys past it are never read)
    mask: torch.Tensor | None     # [G, 1, max_q, num_keys] True = may attend; None: see `causal`
    causal: bool                  # no mask needed: fresh equal-length prompts (plain causal), or
                                  # equal-length decodes (causal=False: attend to everything)
    keep: torch.Tensor | None     # [G * max_q] real (non-padding) rows; None when nothing is padded
    out_rows: torch.Tensor | None  # where the outputs go; None: all rows, in order


def _group(packed: PackedInput, entries: np.ndarray, num_blocks: int, kv_heads: int, device) -> _Group:
    q, ctx, bs = packed.query_lens[entries], packed.context_lens[entries], packed.block_size
    max_q, seq = int(q.max()), q + ctx
    num_keys = int(seq.max())
    t = np.minimum(np.arange(max_q)[None, :], (q - 1)[:, None])       # clamp padding to last row
    rows = packed.query_starts[entries][:, None] + t
    qpos = ctx[:, None] + t                                           # position of each query
    mask = np.arange(num_keys)[None, None, :] <= qpos[:, :, None]     # causal over the whole context
    keep = (np.arange(max_q)[None, :] < q[:, None]).reshape(-1)
    tables = packed.block_tables_np[entries, :blocks_for(num_keys, bs)]
    gather = (tables[:, None, :] + np.arange(kv_heads)[None, :, None] * num_blocks).reshape(-1)

    def dev(x, dtype):
        return torch.from_numpy(np.ascontiguousarray(x)).to(device=device, dtype=dtype)

    in_order = keep.all() and len(entries) == len(packed.query_lens)   # e.g. a decode-only batch
    causal = bool(max_q > 1 and keep.all() and not ctx.any())           # SDPA's top-left causal fits
    return _Group(size=len(entries), max_q=max_q, rows=None if in_order else dev(rows, torch.long),
                  gather=dev(gather, torch.long), num_keys=num_keys, causal=causal,
                  mask=None if mask.all() or causal else dev(mask[:, None], torch.bool),
                  keep=None if keep.all() else dev(keep, torch.bool),
                  out_rows=None if in_order else dev(rows.reshape(-1)[keep], torch.long))


class TorchAttention:
    """Reference backend for any device: gather the paged context by block table, masked SDPA.

    Decodes and prefill chunks form two groups so one long chunk does not pad every decode
    to its length; each group is a single batched SDPA call (GQA via enable_gqa). Its caches
    are head-major in memory ([KVH, blocks, bs, D]): a gather is one index_select of whole
    (head, block) rows (cheaper than an index_select over the block dim) and yields K/V
    contiguous per (entry, head), which SDPA reads faster than block-major ones.
    """
    name = "torch"
    kv_layout = "head_major"

    def plan(self, packed: PackedInput, cache_shape: tuple) -> dict:
        num_blocks, bs, kvh, _ = cache_shape
        device, is_decode = packed.input_ids.device, packed.query_lens == 1
        head_offsets = torch.arange(kvh, device=device)[:, None] * (num_blocks * bs)
        return {"write": (head_offsets + packed.slot_mapping).reshape(-1),     # rows of [KVH * slots, D]
                "groups": [_group(packed, np.nonzero(sel)[0], num_blocks, kvh, device)
                           for sel in (is_decode, ~is_decode) if sel.any()]}

    def forward(self, q, k, v, k_cache, v_cache, packed: PackedInput, meta: dict) -> torch.Tensor:
        k_phys, v_phys = head_major(k_cache), head_major(v_cache)      # [KVH, blocks, bs, D]
        dim = k_phys.shape[-1]
        k_phys.view(-1, dim).index_copy_(0, meta["write"], k.transpose(0, 1).reshape(-1, dim))
        v_phys.view(-1, dim).index_copy_(0, meta["write"], v.transpose(0, 1).reshape(-1, dim))
        with sdpa_kernel(CUDA_SDPA_BACKENDS) if q.is_cuda else contextlib.nullcontext():
            return self._attend(q, k_phys, v_phys, meta["groups"])

    @staticmethod
    def _attend(q, k_phys, v_phys, groups: list, decode=None) -> torch.Tensor:
        """`decode` (a quantised cache's: policylab.dataplane.kv_quant) turns the gathered rows of
        width k_phys.shape[-1] into K/V of q's head dim."""
        kvh, blocks, bs, width = k_phys.shape
        heads, dim = q.shape[1], q.shape[-1]
        out = q.new_empty(q.shape) if len(groups) > 1 or groups[0].out_rows is not None else None
        for g in groups:
            qg = (q if g.rows is None else q[g.rows]).view(g.size, g.max_q, heads, dim).transpose(1, 2)
            kg, vg = (c.view(kvh * blocks, bs * width).index_select(0, g.gather)
                      .view(g.size, kvh, -1, width)[:, :, :g.num_keys]
                      for c in (k_phys, v_phys))                        # [G, KVH, keys, D]
            if decode is not None:
                kg, vg = decode(kg, q.dtype), decode(vg, q.dtype)
            og = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask, is_causal=g.causal,
                                                enable_gqa=True)
            og = og.transpose(1, 2).reshape(-1, heads, dim)
            og = og if g.keep is None else og[g.keep]
            if out is None:
                return og
            out[g.out_rows] = og
        return out


class FlashAttention:
    """CUDA backend: flash_attn_varlen_func (paged, block_table) for prefill chunks,
    flash_attn_with_kvcache for decodes. Upstream flash-attn 2 requires the paged block
    size to be a multiple of 256."""
    name = "flash_attn"
    kv_layout = "block_major"

    def __init__(self):
        try:
            from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
        except ImportError as e:
            raise ImportError("dataplane.attention=flash_attn needs the flash-attn package on a CUDA "
                              "machine (pip install flash-attn); use dataplane.attention=torch") from e
        self.varlen, self.with_kvcache = flash_attn_varlen_func, flash_attn_with_kvcache

    def plan(self, packed: PackedInput, cache_shape: tuple) -> dict:
        if packed.block_size % 256:
            raise ValueError(f"flash_attn paged kernels need engine.block_size divisible by 256, got "
                             f"{packed.block_size}; set engine.block_size=256 or dataplane.attention=torch")
        is_decode = packed.query_lens == 1
        dev = packed.input_ids.device
        meta = {}
        if is_decode.any():
            idx = torch.from_numpy(np.nonzero(is_decode)[0]).to(dev)
            meta["decode"] = (packed.cu_seqlens_q[idx].long(), packed.seq_lens[idx],
                              packed.block_tables[idx])
        if (~is_decode).any():
            sel = np.nonzero(~is_decode)[0]
            q, seq = packed.query_lens[sel], packed.query_lens[sel] + packed.context_lens[sel]
            rows = np.concatenate([np.arange(s, s + n) for s, n in
                                   zip(packed.query_starts[sel], q)])
            cu = lambda x: torch.from_numpy(np.concatenate([[0], np.cumsum(x)]).astype(np.int32)).to(dev)
            meta["prefill"] = (torch.from_numpy(rows).to(dev), cu(q), cu(seq), int(q.max()), int(seq.max()),
                               packed.block_tables[torch.from_numpy(sel).to(dev)])
        return meta

    def forward(self, q, k, v, k_cache, v_cache, packed: PackedInput, meta: dict) -> torch.Tensor:
        write_kv(k, v, k_cache, v_cache, packed.slot_mapping)
        out = torch.empty_like(q)
        if "prefill" in meta:
            rows, cu_q, cu_k, max_q, max_k, tables = meta["prefill"]
            out[rows] = self.varlen(q[rows], k_cache, v_cache, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                    max_seqlen_q=max_q, max_seqlen_k=max_k, causal=True,
                                    block_table=tables)
        if "decode" in meta:
            rows, seq_lens, tables = meta["decode"]
            out[rows] = self.with_kvcache(q[rows].unsqueeze(1), k_cache, v_cache, cache_seqlens=seq_lens,
                                          block_table=tables, causal=True).squeeze(1)
        return out


def make_backend(name: str, device: torch.device):
    if name == "torch":
        return TorchAttention()
    if name == "flash_attn":
        if device.type != "cuda":
            raise ValueError("dataplane.attention=flash_attn runs on CUDA only; this run uses "
                             f"device '{device}'. Use dataplane.attention=torch")
        return FlashAttention()
    if name == "triton":
        try:
            from policylab.dataplane.triton_attention import TritonAttention, check_runnable
        except ImportError as e:
            raise ImportError("dataplane.attention=triton needs the triton package (pip install -e "
                              "'.[triton]'; CUDA builds of torch ship it); use dataplane.attention=torch") from e
        check_runnable(device)
        return TritonAttention(device)
    raise ValueError(f"dataplane.attention must be 'torch', 'flash_attn' or 'triton', got '{name}'")
