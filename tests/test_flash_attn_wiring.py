"""The flash_attn backend's wiring, checked on CPU: a stand-in `flash_attn` module computes
what flash-attn 2 documents for `flash_attn_varlen_func(..., block_table=)` and
`flash_attn_with_kvcache(..., cache_seqlens=, block_table=)` (paged caches [blocks,
block_size, kv_heads, D]; causal mask aligned to the bottom-right corner) in plain torch.
Our backend's block-major KV writes, cu_seqlens, row selection and block tables must then
give the torch backend's logits. The real kernels run only on CUDA (tests/test_dataplane_model.py)."""
from __future__ import annotations

import sys
import types

import torch

from policylab.dataplane.attention import FlashAttention
from policylab.core.batch import Batch
from tests.test_dataplane_model import SMALL, entry, ids, make_plane

BLOCK = 256    # flash-attn 2's paged kernels need a multiple of 256


def _paged(cache, table, n):
    """The first n tokens of a sequence from a paged cache [blocks, bs, KVH, D]."""
    return cache[table.long()].reshape(-1, *cache.shape[2:])[:n]


def _attend(q, k, v, causal):
    """q [Lq, H, D], k/v [Lk, KVH, D]: softmax(QK^T/sqrt(D)) V with GQA, bottom-right causal."""
    heads, kv_heads = q.shape[1], k.shape[1]
    k, v = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q, k) * q.shape[-1] ** -0.5
    if causal:
        lq, lk = q.shape[0], k.shape[0]
        future = torch.arange(lk)[None, :] > torch.arange(lq)[:, None] + (lk - lq)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def fake_flash_attn(calls: list) -> types.ModuleType:
    def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
               block_table=None, **_):
        calls.append("varlen")
        assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == block_table.dtype == torch.int32
        assert max_seqlen_q == int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
        assert max_seqlen_k == int((cu_seqlens_k[1:] - cu_seqlens_k[:-1]).max())
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        return torch.cat([_attend(q[cq[i]:cq[i + 1]], _paged(k, block_table[i], ck[i + 1] - ck[i]),
                                  _paged(v, block_table[i], ck[i + 1] - ck[i]), causal)
                          for i in range(len(cq) - 1)])

    def with_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, causal=False, **_):
        calls.append("with_kvcache")
        assert cache_seqlens.dtype == block_table.dtype == torch.int32 and q.dim() == 4
        return torch.stack([_attend(q[b], _paged(k_cache, block_table[b], n), _paged(v_cache, block_table[b], n),
                                    causal) for b, n in enumerate(cache_seqlens.tolist())])

    return types.SimpleNamespace(flash_attn_varlen_func=varlen, flash_attn_with_kvcache=with_kvcache)


def test_flash_attn_backend_wiring_matches_torch_backend(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "flash_attn", fake_flash_attn(calls))
    ref, flash = make_plane(SMALL), make_plane(SMALL)
    flash.backend = FlashAttention()
    for plane in (ref, flash):
        plane.allocate_kv(8, BLOCK)
    a, b, c = ids(600, 11), ids(300, 12), ids(90, 13)
    ta, tb, tc = [5, 2, 7], [1, 6], [3]
    steps = [
        entry(entry(Batch(), 0, a[:400], 0, ta, sample=False), 1, b, 0, tb),       # two fresh prompts
        entry(entry(entry(Batch(), 0, a[400:], 400, ta), 1, [int(b[-1])], 300, tb),  # chunk after 400,
              2, c, 0, tc),                                                        # a decode, a prompt
        entry(entry(Batch(), 1, [int(b[0])], 301, tb), 2, [int(c[0])], 90, tc),     # decodes only
    ]
    for batch in steps:
        torch.testing.assert_close(flash.forward(batch, all_logits=True), ref.forward(batch, all_logits=True),
                                   atol=2e-4, rtol=0)
    assert "varlen" in calls and "with_kvcache" in calls
