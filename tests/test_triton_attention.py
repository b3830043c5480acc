"""The `triton` attention backend: kernels against a dense reference, the plane against the torch
backend and HF through mixed batches and a full engine run (chunks, decodes, preemption and
recompute), and deliberately broken variants that these comparisons must catch.

On CPU the kernels run in Triton's interpreter: TRITON_INTERPRET=1 is set here, before triton
is first imported (nothing else in the suite imports it). POLICYLAB_TEST_DEVICE=cuda runs the
same tests compiled on a GPU."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from tests.test_dataplane_model import DEVICE

if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton", reason="triton is not installed: pip install -e '.[triton]'")

from policies.prefill_first import PrefillFirst  # noqa: E402
from policylab.core.config import EngineConfig  # noqa: E402
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane import triton_kernels as kernels  # noqa: E402
from policylab.dataplane.attention import make_backend  # noqa: E402
from policylab.core.batch import Batch  # noqa: E402
from policylab.dataplane.cuda_graphs import DecodeGraphRunner  # noqa: E402
from policylab.dataplane.torch_plane import TorchDataPlane  # noqa: E402
from policylab.core.engine import Engine  # noqa: E402
from policylab.core.request import TraceRequest  # noqa: E402
from tests.test_dataplane_model import ATOL, BS, SMALL, dataplane, entry, hf_logits, hf_model, ids  # noqa: E402


def reference_attention(q, k, v, ctx):
    """q [L, H, D] at positions ctx..ctx+L-1; k/v [ctx+L, KVH, D]: causal softmax attention in float32."""
    heads, kv_heads = q.shape[1], k.shape[1]
    k, v = (x.float().repeat_interleave(heads // kv_heads, dim=1) for x in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * q.shape[-1] ** -0.5
    keys, queries = (torch.arange(n, device=q.device) for n in (k.shape[0], q.shape[0]))
    future = keys[None, :] > ctx + queries[:, None]
    return torch.einsum("hqk,khd->qhd", scores.masked_fill(future, float("-inf")).softmax(-1), v)


# (context, new tokens): a fresh prompt, a chunk after context, a one-token prompt, decodes
ENTRIES = [(0, 19), (9, 5), (0, 1), (12, 1), (37, 1)]


@pytest.mark.parametrize("dtype,block_size,head_dim,kv_heads", [
    (torch.float32, 4, 32, 2), (torch.float32, 1, 32, 2), (torch.float32, 5, 24, 6),
    (torch.bfloat16, 16, 32, 2), (torch.float16, 3, 32, 3)])
def test_kernels_match_dense_reference(dtype, block_size, head_dim, kv_heads):
    """Six query heads over 2 KV heads (GQA, groups of 3), 6 (MHA) or 3; block sizes from 1 to 16."""
    gen = torch.Generator().manual_seed(block_size)
    heads = 6
    num_blocks = sum(-(-(c + n) // block_size) for c, n in ENTRIES) + 8      # a few blocks stay unused
    rnd = lambda *shape: torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)  # noqa: E731
    k_cache, v_cache = (torch.zeros(num_blocks, block_size, kv_heads, head_dim, device=DEVICE, dtype=dtype)
                        for _ in range(2))
    blocks = torch.randperm(num_blocks, generator=gen).tolist()                 # scrambled block order
    width = max(-(-(c + n) // block_size) for c, n in ENTRIES)
    tables = torch.zeros(len(ENTRIES), width, dtype=torch.int32)
    keys, values, slots, queries = [], [], [], []
    for e, (ctx, n) in enumerate(ENTRIES):
        need = -(-(ctx + n) // block_size)
        tables[e, :need] = torch.tensor([blocks.pop() for _ in range(need)])
        pos = torch.arange(ctx + n)
        slots.append(tables[e, pos // block_size].long() * block_size + pos % block_size)
        keys.append(rnd(ctx + n, kv_heads, head_dim))
        values.append(rnd(ctx + n, kv_heads, head_dim))
        queries.append(rnd(n, heads, head_dim))
    tables = tables.to(DEVICE)
    ctxs = [ctx for ctx, _ in ENTRIES]
    earlier = lambda xs: torch.cat([x[:c] for x, c in zip(xs, ctxs)])  # noqa: E731
    now = lambda xs: torch.cat([x[c:] for x, c in zip(xs, ctxs)])      # noqa: E731
    kernels.store_kv(earlier(keys), earlier(values), k_cache, v_cache, earlier(slots).to(DEVICE))
    padding = torch.ones(1, kv_heads, head_dim, device=DEVICE, dtype=dtype)   # slot -1: never written
    kernels.store_kv(torch.cat([now(keys), padding]), torch.cat([now(values), padding]), k_cache, v_cache,
                     torch.cat([now(slots), torch.tensor([-1])]).to(DEVICE))
    all_slots = torch.cat(slots).to(DEVICE)
    flat_k = k_cache.view(-1, kv_heads, head_dim)
    assert torch.equal(flat_k[all_slots], torch.cat(keys))
    untouched = torch.ones(len(flat_k), dtype=torch.bool, device=DEVICE)
    untouched[all_slots] = False
    assert not flat_k[untouched].any()

    q = torch.cat(queries)
    out = torch.full_like(q, float("nan"))
    lens = torch.tensor([n for _, n in ENTRIES])
    starts = torch.cumsum(lens, 0) - lens
    prefill = [e for e, (_, n) in enumerate(ENTRIES) if n > 1]
    decode = [e for e, (_, n) in enumerate(ENTRIES) if n == 1]
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=DEVICE)  # noqa: E731
    kernels.paged_prefill(q, out, k_cache, v_cache, tables[prefill], i32([int(starts[e]) for e in prefill]),
                          i32([ENTRIES[e][1] for e in prefill]), i32([ENTRIES[e][0] for e in prefill]),
                          max_q=19, block_m=16, block_n=16)       # 19 queries: two tiles, one partial
    decoded = torch.empty(len(decode), heads, head_dim, device=DEVICE, dtype=dtype)
    kernels.paged_decode(q[starts[decode].to(DEVICE)], decoded, k_cache, v_cache, tables[decode],
                         i32([sum(ENTRIES[e]) for e in decode]), block_n=16)
    out[starts[decode].to(DEVICE)] = decoded
    want = torch.cat([reference_attention(qe, ke, ve, ctx) for qe, ke, ve, (ctx, _)
                      in zip(queries, keys, values, ENTRIES)])
    tol = (1e-5 if DEVICE == "cpu" else 1e-4) if dtype == torch.float32 else 2e-2   # GPU: other summation orders
    torch.testing.assert_close(out.float(), want, atol=tol, rtol=tol)


def triton_plane(num_blocks: int = 64) -> TorchDataPlane:
    plane = TorchDataPlane.from_config(dataplane(attention="triton", cuda_graphs=False), SMALL, 0)
    plane.allocate_kv(num_blocks, BS)
    return plane


def torch_plane(num_blocks: int = 64) -> TorchDataPlane:
    plane = TorchDataPlane.from_config(dataplane(), SMALL, 0)
    plane.allocate_kv(num_blocks, BS)
    return plane


def mixed_steps() -> list:
    """Two fresh prompts (one a first chunk); then its next chunk, a decode and a prompt whose
    first two blocks are another request's prefix-cache blocks; then decodes only."""
    a, b, d = ids(40, 2), ids(30, 3), ids(33, 4)
    c = np.concatenate([d[:8], ids(10, 5)])
    ta, tb, td = [3, 8, 1, 12, 20, 6, 7, 22, 23, 24, 25], [13, 14, 2, 15, 16, 18, 19, 21, 26], list(range(30, 39))
    tc = td[:2] + [50, 51, 52]
    return [entry(entry(entry(Batch(), 0, a[:24], 0, ta, sample=False), 1, b, 0, tb), 3, d, 0, td),
            entry(entry(entry(Batch(), 0, a[24:], 24, ta), 1, [7], 30, tb), 2, c[8:], 8, tc),
            entry(entry(entry(Batch(), 0, [5], 40, ta), 1, [9], 31, tb), 2, [4], 18, tc)]


@pytest.mark.slow
def test_mixed_batches_match_torch_backend_and_hf():
    ours, ref, hf = triton_plane(), torch_plane(), hf_model(SMALL)
    steps = mixed_steps()
    for batch in steps:
        torch.testing.assert_close(ours.forward(batch, all_logits=True), ref.forward(batch, all_logits=True),
                                   atol=ATOL, rtol=0)
    a = np.concatenate([steps[0].token_ids[0], steps[1].token_ids[0], [5]])
    b = np.concatenate([steps[0].token_ids[1], [7, 9]])
    c = np.concatenate([steps[0].token_ids[2][:8], steps[1].token_ids[2], [4]])
    want = torch.cat([hf_logits(hf, a)[40:], hf_logits(hf, b)[31:], hf_logits(hf, c)[18:]])
    torch.testing.assert_close(ours.forward(steps[2], all_logits=True), want, atol=ATOL, rtol=0)

@pytest.mark.slow
def test_engine_run_matches_torch_backend_step_by_step():
    """Chunked prefill, decodes, preemption and recompute: every step's logits (all rows) equal
    the torch backend's on the same batch, so the greedy outputs are the same too."""
    ours, ref = TorchDataPlane.from_config(dataplane(attention="triton", cuda_graphs=False), SMALL, 0), torch_plane(20)
    seen, forward = [], ours.forward

    def checked_forward(batch, all_logits=False):
        got, want = forward(batch, all_logits=True), ref.forward(batch, all_logits=True)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
        seen.extend(zip(batch.query_lens, batch.context_lens))
        rows = np.cumsum(batch.query_lens)[np.asarray(batch.sample, dtype=bool)] - 1
        return got if all_logits else got[torch.as_tensor(rows, device=got.device)]

    ours.forward = checked_forward
    trace = [TraceRequest(arrival_time=0.0, prompt_tokens=p, output_tokens=o)
             for p, o in ((40, 8), (12, 10), (10, 9), (14, 7))]
    cfg = EngineConfig(block_size=BS, num_blocks=20, max_num_batched_tokens=32, max_num_seqs=8,
                       max_model_len=256, check_invariants=True)
    result = Engine(trace, PrefillFirst(), ours, cfg, seed=0).run()
    assert result.status == "complete", result.error
    assert sum(r.num_preemptions for r in result.requests) > 0
    assert any(n > 1 and ctx > 0 for n, ctx in seen), "no prefill chunk after context ran"
    assert sum(n == 1 for n, _ in seen) > 20, "too few decodes ran"


def _broken(monkeypatch, name: str) -> None:
    """Swap one kernel launch for a deliberately wrong one."""
    decode, prefill = kernels.paged_decode, kernels.paged_prefill

    def context_one_short(q, out, k_cache, v_cache, tables, seq_lens, **kw):
        decode(q, out, k_cache, v_cache, tables, seq_lens - 1, **kw)

    def context_one_long(q, out, k_cache, v_cache, tables, starts, lens, ctx, max_q, **kw):
        prefill(q, out, k_cache, v_cache, tables, starts, lens, ctx + 1, max_q, **kw)

    def wrong_table_row(q, out, k_cache, v_cache, tables, seq_lens, **kw):
        decode(q, out, k_cache, v_cache, tables.roll(1, 0), seq_lens, **kw)

    def no_causal_mask(*args, **kw):
        prefill(*args, **{**kw, "causal": False})

    target, wrong = {"decode context one short": ("paged_decode", context_one_short),
                     "prefill context one long": ("paged_prefill", context_one_long),
                     "wrong block-table row": ("paged_decode", wrong_table_row),
                     "missing causal mask": ("paged_prefill", no_causal_mask)}[name]
    monkeypatch.setattr(kernels, target, wrong)


@pytest.mark.parametrize("variant", ["decode context one short", "prefill context one long",
                                     "wrong block-table row", "missing causal mask"])
@pytest.mark.slow
def test_broken_kernels_are_caught(monkeypatch, variant):
    ours, ref = triton_plane(), torch_plane()
    _broken(monkeypatch, variant)
    mismatched = []
    for batch in mixed_steps():
        got, want = ours.forward(batch, all_logits=True), ref.forward(batch, all_logits=True)
        mismatched.append(not torch.allclose(got, want, atol=ATOL, rtol=0))
    assert any(mismatched), f"'{variant}' went unnoticed"


@pytest.mark.skipif(DEVICE != "cpu", reason="on a GPU the kernels compile when the other tests run them")
@pytest.mark.skipif(importlib.util.find_spec("triton.backends.nvidia") is None,
                    reason="this triton wheel has no NVIDIA backend")
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_launched_kernels_compile_for_hopper():
    """What the backend launches compiles, through ptxas, for an H100/H200 (sm_90): no GPU is
    needed to catch a kernel that Triton cannot lower (tests/compile_triton_kernels.py)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "tests.compile_triton_kernels", "bfloat16", "float32"], env=env,
                         text=True, capture_output=True, cwd=Path(__file__).resolve().parents[1], timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert [line.split(":")[0] for line in run.stdout.splitlines()] == \
        [f"{dtype} {kernel}" for dtype in ("bfloat16", "float32")
         for kernel in ("_store_kv_kernel", "_prefill_kernel", "_decode_kernel")], run.stdout


def test_triton_backend_refuses_cpu_without_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="runs on CUDA"):
        make_backend("triton", torch.device("cpu"))


def graph_scenario() -> list:
    """Five fresh prompts (eager), then decodes of three (bucket 4), of all five (bucket 8), and
    of four with one entry not sampled; block 0 stays unused, so stray padding writes would show."""
    prompts = [ids(6 + 2 * i, 20 + i) for i in range(5)]
    tables = [[1 + 6 * i + j for j in range(6)] for i in range(5)]
    first = Batch()
    for i, p in enumerate(prompts):
        entry(first, i, p, 0, tables[i])
    ctx = [len(p) for p in prompts]

    def decodes(members, sample=None):
        batch = Batch()
        for k, i in enumerate(members):
            entry(batch, i, [40 + ctx[i]], ctx[i], tables[i], sample=True if sample is None else sample[k])
            ctx[i] += 1
        return batch
    return [first, decodes([0, 2, 4]), decodes(range(5)), decodes([1, 2, 3, 4], [True, False, True, True])]


@pytest.mark.slow
def test_graph_runner_replays_decodes_like_eager_steps():
    """The runner over static buffers, with a capture that only calls the step (what a CUDA graph
    replays), gives the torch backend's logits and KV cache: padding rows write nothing."""
    ours, ref, replayed = triton_plane(), torch_plane(), []
    with torch.inference_mode():
        ours.graphs = DecodeGraphRunner(ours.model, ours.kv_caches, ours.backend, BS, 64 * BS, ours.device,
                                        capture=lambda step: lambda: replayed.append(1) or step(), max_batch=8)
    for batch in graph_scenario():
        torch.testing.assert_close(ours.forward(batch), ref.forward(batch), atol=ATOL, rtol=0)
    assert len(replayed) == 3
    for (k, v), (ref_k, ref_v) in zip(ours.kv_caches, ref.kv_caches):
        torch.testing.assert_close(k, ref_k, atol=ATOL, rtol=0)
        torch.testing.assert_close(v, ref_v, atol=ATOL, rtol=0)
    assert not ours.kv_caches[0][0][0].any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CUDA graphs)")
def test_cuda_graph_decodes_match_eager_on_cuda():
    planes = []
    for graphs in (True, False):
        plane = TorchDataPlane.from_config(DataplaneConfig(device="cuda", dtype="float32", attention="triton",
                                                           cuda_graphs=graphs), SMALL, 0)
        plane.allocate_kv(64, BS)
        planes.append(plane)
    assert planes[0].graphs is not None and planes[1].graphs is None
    for batch in graph_scenario():
        got, want = (p.forward(batch) for p in planes)
        torch.testing.assert_close(got, want, atol=1e-3, rtol=0)
