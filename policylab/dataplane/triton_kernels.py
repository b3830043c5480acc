"""Triton kernels of the `triton` attention backend over the paged KV cache.

Caches are [num_blocks, block_size, kv_heads, head_dim] views addressed by their strides;
a token's K/V live at (table[pos // block_size], pos % block_size). The block table is read
per key, so any block size works (no power-of-two tiles over blocks). Scores and the softmax
run in float32 whatever the cache dtype, as the torch backend's SDPA does.

- `store_kv`: this step's K/V into their slots (slot -1: padding, skipped);
- `paged_decode`: one query per sequence, one program per (sequence, KV head) serving every
  query head of its GQA group;
- `paged_prefill`: a chunk of queries per program over its cached context and itself,
  causal within the chunk (query at position p sees keys 0..p).

Triton is imported here only: `make_backend` imports this module lazily. On CPU the kernels
run in Triton's interpreter (TRITON_INTERPRET=1 set before the import), which the tests use.
"""
from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache, v_cache, slot_ptr, stride_kt, stride_vt,
                     stride_cb, stride_ct, stride_ch,
                     KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                     D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    token = tl.program_id(0)
    h, d = tl.arange(0, HEADS_PAD), tl.arange(0, D_PAD)
    # the slot, repeated per head: Triton's interpreter rejects a mask and-ed with a scalar
    slot = tl.load(slot_ptr + token + 0 * h[:, None]).to(tl.int64)
    mask = (h[:, None] < KV_HEADS) & (d[None, :] < HEAD_DIM) & (slot >= 0)
    src = h[:, None] * HEAD_DIM + d[None, :]                   # rows of k/v are [kv_heads, head_dim]
    dst = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_ct + h[:, None] * stride_ch + d[None, :]
    tl.store(k_cache + dst, tl.load(k_ptr + token * stride_kt + src, mask=mask), mask=mask)
    tl.store(v_cache + dst, tl.load(v_ptr + token * stride_vt + src, mask=mask), mask=mask)


@triton.jit
def _paged_key_rows(table_row_ptr, pos, seq_len, kv_head, stride_cb, stride_ct, stride_ch,
                    BLOCK_SIZE: tl.constexpr):
    """Cache offsets of one sequence's key positions `pos` (through its block-table row), and
    which of them exist: the one paged lookup both attention kernels make."""
    valid = pos < seq_len
    block = tl.load(table_row_ptr + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    return block * stride_cb + (pos % BLOCK_SIZE) * stride_ct + kv_head * stride_ch, valid


@triton.jit
def _decode_kernel(q_ptr, o_ptr, k_cache, v_cache, table_ptr, seq_lens_ptr,
                   stride_qt, stride_qh, stride_ot, stride_oh, stride_table,
                   stride_cb, stride_ct, stride_ch, scale,
                   GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                   D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    seq, kv_head = tl.program_id(0), tl.program_id(1)
    g, d, n = tl.arange(0, GROUP_PAD), tl.arange(0, D_PAD), tl.arange(0, BLOCK_N)
    head = kv_head * GROUP + g
    q_mask = (g[:, None] < GROUP) & (d[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + seq * stride_qt + head[:, None] * stride_qh + d[None, :], mask=q_mask, other=0.0)
    q = q.to(tl.float32) * scale
    seq_len = tl.load(seq_lens_ptr + seq)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        pos = start + n
        row, valid = _paged_key_rows(table_ptr + seq * stride_table, pos, seq_len, kv_head,
                                     stride_cb, stride_ct, stride_ch, BLOCK_SIZE)
        kv_mask = valid[:, None] & (d[None, :] < HEAD_DIM)
        k = tl.load(k_cache + row[:, None] + d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)                      # [GROUP_PAD, BLOCK_N]
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        v = tl.load(v_cache + row[:, None] + d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + seq * stride_ot + head[:, None] * stride_oh + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=q_mask)


@triton.jit
def _prefill_kernel(q_ptr, o_ptr, k_cache, v_cache, table_ptr, q_start_ptr, q_len_ptr, ctx_len_ptr,
                    stride_qt, stride_qh, stride_table, stride_cb, stride_ct, stride_ch, scale,
                    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    CAUSAL: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    tile, head, entry = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kv_head = head // GROUP
    q_start, q_len = tl.load(q_start_ptr + entry), tl.load(q_len_ptr + entry)
    ctx_len = tl.load(ctx_len_ptr + entry)
    seq_len = ctx_len + q_len
    m, d, n = tile * BLOCK_M + tl.arange(0, BLOCK_M), tl.arange(0, D_PAD), tl.arange(0, BLOCK_N)
    q_mask = (m[:, None] < q_len) & (d[None, :] < HEAD_DIM)
    q_rows = (q_start + m).to(tl.int64)[:, None] * stride_qt + head * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_rows, mask=q_mask, other=0.0).to(DOT_DTYPE)
    q_pos = ctx_len + m                                         # absolute position of each query
    last_key = tl.minimum(ctx_len + (tile + 1) * BLOCK_M, seq_len) if CAUSAL else seq_len
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    for start in range(0, last_key, BLOCK_N):
        pos = start + n
        row, valid = _paged_key_rows(table_ptr + entry * stride_table, pos, seq_len, kv_head,
                                     stride_cb, stride_ct, stride_ch, BLOCK_SIZE)
        kv_mask = valid[:, None] & (d[None, :] < HEAD_DIM)
        k = tl.load(k_cache + row[:, None] + d[None, :], mask=kv_mask, other=0.0).to(DOT_DTYPE)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale        # [BLOCK_M, BLOCK_N]
        seen = valid[None, :] & (pos[None, :] <= q_pos[:, None]) if CAUSAL else valid[None, :]
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        v = tl.load(v_cache + row[:, None] + d[None, :], mask=kv_mask, other=0.0).to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + q_rows, out.to(o_ptr.dtype.element_ty), mask=q_mask)


DOT_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def dot_types(dtype: torch.dtype, interpreted: bool) -> tuple:
    """The prefill dots' operand type and input precision. Float32 dots skip TF32 rounding (greedy
    tokens must equal the torch backend's); Triton's interpreter (3.9) computes bfloat16 dots wrongly,
    so there they run in float32."""
    dot_dtype = tl.float32 if interpreted and dtype == torch.bfloat16 else DOT_DTYPES[dtype]
    return dot_dtype, "ieee" if dot_dtype == tl.float32 else "tf32"


def _pow2(n: int, at_least: int = 1) -> int:
    return max(triton.next_power_of_2(n), at_least)


def _cache_strides(cache: torch.Tensor) -> tuple:
    if cache.stride(-1) != 1:
        raise ValueError("the triton backend needs caches whose head_dim is contiguous")
    return cache.stride(0), cache.stride(1), cache.stride(2)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k/v [T, kv_heads, D] (rows contiguous) -> cache slots; slot -1 rows are not written."""
    tokens, kv_heads, dim = k.shape
    if tokens == 0:
        return
    k, v = (x if x.stride(2) == 1 and x.stride(1) == dim else x.contiguous() for x in (k, v))
    _store_kv_kernel[(tokens,)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0),
                                *_cache_strides(k_cache), KV_HEADS=kv_heads, HEADS_PAD=_pow2(kv_heads),
                                HEAD_DIM=dim, D_PAD=_pow2(dim), BLOCK_SIZE=k_cache.shape[1])


def paged_decode(q: torch.Tensor, out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor, block_n: Optional[int] = None) -> None:
    """q/out [B, heads, D], one query per sequence, attending to its first seq_lens[b] tokens.
    By default a tile of keys holds at most 8k (head, key, dim) products, to stay in registers."""
    batch, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    block_n = block_n or max(16, min(64, 8192 // (_pow2(group) * _pow2(dim))))
    _decode_kernel[(batch, kv_heads)](
        q, out, k_cache, v_cache, block_tables, seq_lens, q.stride(0), q.stride(1), out.stride(0),
        out.stride(1), block_tables.stride(0), *_cache_strides(k_cache), dim ** -0.5,
        GROUP=group, GROUP_PAD=_pow2(group), HEAD_DIM=dim, D_PAD=_pow2(dim),
        BLOCK_SIZE=k_cache.shape[1], BLOCK_N=block_n)


def paged_prefill(q: torch.Tensor, out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  block_tables: torch.Tensor, q_starts: torch.Tensor, q_lens: torch.Tensor,
                  ctx_lens: torch.Tensor, max_q: int, block_m: int = 64, block_n: int = 32,
                  causal: bool = True) -> None:
    """Entry e's queries are rows q_starts[e] .. + q_lens[e] of q/out [T, heads, D], at positions
    ctx_lens[e] onwards. `causal=False` exists to prove the tests catch a missing mask."""
    heads, dim = q.shape[1], q.shape[2]
    if out.stride() != q.stride():
        raise ValueError("paged_prefill writes out at q's rows: give both the same strides")
    group = heads // k_cache.shape[2]
    dot_dtype, precision = dot_types(q.dtype, os.environ.get("TRITON_INTERPRET") == "1")
    grid = (triton.cdiv(max_q, block_m), heads, len(q_lens))
    _prefill_kernel[grid](
        q, out, k_cache, v_cache, block_tables, q_starts, q_lens, ctx_lens, q.stride(0), q.stride(1),
        block_tables.stride(0), *_cache_strides(k_cache), dim ** -0.5,
        GROUP=group, HEAD_DIM=dim, D_PAD=_pow2(dim, 16), BLOCK_SIZE=k_cache.shape[1],
        BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, DOT_DTYPE=dot_dtype, PRECISION=precision,
        num_warps=8, num_stages=2)   # sm_90, 64x32 tiles: no register spills up to head_dim 128 in fp32
