"""Flat input packing: one engine `Batch` -> the tensors of one forward pass.

No padding to the longest prompt: every scheduled token is one row of the flat batch
(vLLM v1 / nano-vLLM layout). Everything per-token is computed with numpy in a few
vectorized ops, then moved to the device once.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from policylab.core.batch import Batch
from policylab.core.kv import blocks_for


@dataclass
class PackedInput:
    input_ids: torch.Tensor       # [T] int64, the new tokens of every entry, batch order
    positions: torch.Tensor       # [T] int64, position of each token in its sequence
    slot_mapping: torch.Tensor    # [T] int64, flat KV slot each token's K/V is written to
    block_tables: torch.Tensor    # [B, max_blocks] int32, padded with 0 (masked by seq_lens)
    seq_lens: torch.Tensor        # [B] int32, context + query tokens, per entry
    cu_seqlens_q: torch.Tensor    # [B+1] int32, prefix sums of query_lens
    cu_seqlens_k: torch.Tensor    # [B+1] int32, prefix sums of seq_lens
    logits_indices: torch.Tensor  # [S] int64, row of the last token of each sampled entry
    query_lens: np.ndarray        # [B] host copies, for backends that plan on the host
    query_starts: np.ndarray      # [B] first flat row of each entry
    context_lens: np.ndarray      # [B]
    block_tables_np: np.ndarray   # [B, max_blocks]
    block_size: int

    @property
    def num_entries(self) -> int:
        return len(self.query_lens)

    @property
    def max_query_len(self) -> int:
        return int(self.query_lens.max())

    @property
    def max_seq_len(self) -> int:
        return int((self.query_lens + self.context_lens).max())


def _prefix_sum(x: np.ndarray) -> np.ndarray:
    out = np.zeros(len(x) + 1, dtype=np.int32)
    np.cumsum(x, out=out[1:])
    return out


def pack(batch: Batch, block_size: int, device: torch.device) -> PackedInput:
    """Build the flat tensors; raises ValueError if an entry's block table is too short."""
    q = np.asarray(batch.query_lens, dtype=np.int64)
    ctx = np.asarray(batch.context_lens, dtype=np.int64)
    seq = q + ctx
    n_blocks = [len(t) for t in batch.block_tables]
    need = blocks_for(seq, block_size)
    short = np.nonzero(np.asarray(n_blocks) < need)[0]
    if len(short):
        i = int(short[0])
        raise ValueError(f"batch entry {i} (req {batch.req_ids[i]}): {n_blocks[i]} KV blocks cannot "
                         f"hold {int(seq[i])} tokens at block_size={block_size}")
    tables = np.zeros((len(q), max(max(n_blocks), 1)), dtype=np.int32)
    for i, t in enumerate(batch.block_tables):
        tables[i, :len(t)] = t
    cu_q = _prefix_sum(q)
    entry = np.repeat(np.arange(len(q)), q)                       # entry of each flat token
    positions = np.arange(cu_q[-1]) - np.repeat(cu_q[:-1], q) + np.repeat(ctx, q)
    slots = tables[entry, positions // block_size].astype(np.int64) * block_size + positions % block_size
    ids = np.concatenate([np.asarray(t, dtype=np.int64) for t in batch.token_ids])
    if len(ids) != cu_q[-1]:
        raise ValueError(f"batch has {len(ids)} token ids but query_lens sum to {int(cu_q[-1])}")
    sample_rows = (cu_q[1:] - 1)[np.asarray(batch.sample, dtype=bool)]

    def dev(x, dtype):
        return torch.from_numpy(np.ascontiguousarray(x)).to(device=device, dtype=dtype)

    return PackedInput(
        input_ids=dev(ids, torch.long), positions=dev(positions, torch.long),
        slot_mapping=dev(slots, torch.long), block_tables=dev(tables, torch.int32),
        seq_lens=dev(seq, torch.int32), cu_seqlens_q=dev(cu_q, torch.int32),
        cu_seqlens_k=dev(_prefix_sum(seq), torch.int32),
        logits_indices=dev(sample_rows, torch.long),
        query_lens=q, query_starts=cu_q[:-1].astype(np.int64), context_lens=ctx,
        block_tables_np=tables, block_size=block_size)
