"""The torch data plane's model against HF transformers: prefill, paged decode, mixed
batches with chunked prefills and prefix-cache context, KV slot placement, sampling."""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch

from policylab.core.config import ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.core.batch import Batch
from policylab.dataplane.sampling import filter_logits, sample
from policylab.dataplane.torch_plane import TorchDataPlane
from policylab.dataplane.weights import random_state_dict, to_hf_config
from policylab.core.request import SamplingParams

SMALL = ModelConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=1000)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
VARIANTS = {
    "llama-gqa": SMALL,
    "llama3-rope": dataclasses.replace(SMALL, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE),
    "qwen2-bias-untied": dataclasses.replace(SMALL, architecture="qwen2", attention_bias=True,
                                             tie_word_embeddings=False, num_key_value_heads=1),
}
BS = 4   # small blocks: every test sequence spans several, in scrambled order
# POLICYLAB_TEST_DEVICE=cuda runs the HF equality checks on a GPU (float32 on both sides);
# cuBLAS and the fused q/k/v GEMM sum in other orders than HF, hence the looser tolerance there
DEVICE = os.environ.get("POLICYLAB_TEST_DEVICE", "cpu")
ATOL = 2e-4 if DEVICE == "cpu" else 1e-3


def dataplane(**overrides) -> DataplaneConfig:
    return DataplaneConfig(device=DEVICE, dtype="float32", **overrides)


def make_plane(cfg: ModelConfig, num_blocks: int = 64, seed: int = 0) -> TorchDataPlane:
    plane = TorchDataPlane.from_config(dataplane(), cfg, seed)
    plane.allocate_kv(num_blocks, BS)
    return plane


def hf_model(cfg: ModelConfig, seed: int = 0):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_config(to_hf_config(cfg)).eval()
    missing, unexpected = model.load_state_dict(random_state_dict(cfg, seed), strict=False)
    assert not unexpected and set(missing) <= ({"lm_head.weight"} if cfg.tie_word_embeddings else set())
    return model.to(DEVICE)


def as_ids(tokens) -> torch.Tensor:
    """[1, T] int64 token ids on the test device, HF's input shape."""
    return torch.as_tensor(np.asarray(tokens), dtype=torch.long, device=DEVICE)[None]


def ids(n: int, seed: int, vocab: int = 1000) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, n).astype(np.int32)


def hf_logits(model, tokens) -> torch.Tensor:
    with torch.no_grad():
        return model(as_ids(tokens)).logits[0]


def entry(batch: Batch, rid, tokens, ctx, table, sample=True, params=SamplingParams()):
    for field, value in zip(("req_ids", "query_lens", "context_lens", "block_tables", "token_ids",
                             "sample", "sampling"),
                            (rid, len(tokens), ctx, table, np.asarray(tokens, np.int32), sample, params)):
        getattr(batch, field).append(value)
    return batch


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_then_paged_decode_match_hf(variant):
    cfg = VARIANTS[variant]
    plane, ref = make_plane(cfg), hf_model(cfg)
    prompt, table = ids(21, 1), [9, 2, 30, 5, 17, 11, 40]       # 21 tokens + 3 decodes fit 7 blocks
    ours = plane.forward(entry(Batch(), 0, prompt, 0, table), all_logits=True)
    with torch.no_grad():
        out = ref(as_ids(prompt), use_cache=True)
    torch.testing.assert_close(ours, out.logits[0], atol=ATOL, rtol=0)
    cache, seq = out.cache, list(prompt)
    for step in range(3):
        tok = int(ours[-1].argmax())
        ours = plane.forward(entry(Batch(), 0, [tok], len(seq), table))
        with torch.no_grad():
            out = ref(as_ids([tok]), cache=cache, use_cache=True)
        seq.append(tok)
        torch.testing.assert_close(ours, out.logits[0], atol=ATOL, rtol=0, msg=f"decode step {step}")


def test_mixed_batch_matches_unpaged_reference():
    """One pass holding a second prefill chunk, a decode, and a prompt whose first two blocks
    come from another request's prefix-cache blocks; every logit equals HF on the full text."""
    plane, ref = make_plane(SMALL), hf_model(SMALL)
    a, b, d = ids(40, 2), ids(30, 3), ids(33, 4)
    c = np.concatenate([d[:8], ids(10, 5)])                    # shares d's first 2 blocks (8 tokens)
    ta, tb, td = [3, 8, 1, 12, 20, 6, 7, 22, 23, 24], [13, 14, 2, 15, 16, 18, 19, 21], list(range(30, 39))
    tc = td[:2] + [50, 51, 52]
    first = entry(entry(entry(Batch(), 0, a[:24], 0, ta, sample=False), 1, b, 0, tb), 3, d, 0, td)
    b_next = int(plane.forward(first)[0].argmax())
    mixed = entry(entry(entry(Batch(), 0, a[24:], 24, ta), 1, [b_next], 30, tb), 2, c[8:], 8, tc)
    got = plane.forward(mixed, all_logits=True)
    want = torch.cat([hf_logits(ref, a)[24:], hf_logits(ref, np.append(b, b_next))[30:],
                      hf_logits(ref, c)[8:]])
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    sampled = plane.forward(mixed)                              # only the sampled rows, batch order
    torch.testing.assert_close(sampled, want[[15, 16, 26]], atol=ATOL, rtol=0)


def test_kv_writes_land_exactly_at_assigned_slots():
    cfg = VARIANTS["llama-gqa"]
    plane, ref = make_plane(cfg, num_blocks=16), hf_model(cfg)
    prompt, table = ids(10, 6), [7, 2, 11]
    plane.forward(entry(Batch(), 0, prompt, 0, table))
    with torch.no_grad():
        cache = ref(as_ids(prompt), use_cache=True).cache
    pos = np.arange(10)
    slots = torch.as_tensor(np.asarray(table)[pos // BS] * BS + pos % BS, device=DEVICE)
    for layer, (k_cache, v_cache) in enumerate(plane.kv_caches):
        assert k_cache.shape == (16, BS, cfg.num_key_value_heads, 32)
        flat_k, flat_v = k_cache.reshape(-1, *k_cache.shape[2:]), v_cache.reshape(-1, *v_cache.shape[2:])
        ref_k, ref_v = cache.layers[layer].keys[0], cache.layers[layer].values[0]    # [KVH, T, D]
        torch.testing.assert_close(flat_k[slots], ref_k.transpose(0, 1), atol=ATOL, rtol=0)
        torch.testing.assert_close(flat_v[slots], ref_v.transpose(0, 1), atol=ATOL, rtol=0)
        untouched = torch.ones(flat_k.shape[0], dtype=torch.bool, device=DEVICE)
        untouched[slots] = False
        assert not flat_k[untouched].any() and not flat_v[untouched].any()


@pytest.mark.parametrize("variant", ["llama3-rope", "qwen2-bias-untied"])
def test_hf_dir_checkpoint_loads_with_its_own_shape(variant, tmp_path, capsys):
    ref = hf_model(VARIANTS[variant])
    ref.save_pretrained(tmp_path)
    yaml_cfg = ModelConfig(name="ckpt", source="hf_dir", path=str(tmp_path))     # tiny-shaped defaults
    plane = TorchDataPlane.from_config(dataplane(), yaml_cfg, 0)
    assert "the checkpoint's shape wins" in capsys.readouterr().out
    assert plane.cfg.num_hidden_layers == 2 and plane.cfg.architecture == ref.config.model_type
    plane.allocate_kv(16, BS)
    prompt = ids(13, 9)
    torch.testing.assert_close(plane.forward(entry(Batch(), 0, prompt, 0, [4, 1, 9, 0]), all_logits=True),
                               hf_logits(ref, prompt), atol=ATOL, rtol=0)


def test_short_block_table_is_a_clear_error():
    plane = make_plane(SMALL)
    with pytest.raises(ValueError, match="cannot hold 9 tokens"):
        plane.forward(entry(Batch(), 7, ids(9, 0), 0, [0, 1]))


def test_sampling_is_seeded_per_request_and_position():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    hot = SamplingParams(temperature=1.0)
    first = sample(logits, [hot, hot, SamplingParams()], [1, 2, 3], [10, 10, 10], seed=0)
    assert first[2] == int(logits[2].argmax())
    # same (request, position): same token, whatever else is in the batch
    assert sample(logits[1:2], [hot], [2], [10], seed=0) == [first[1]]
    draws = {tuple(sample(logits, [hot] * 3, [1, 2, 3], [p] * 3, seed=0)) for p in range(20)}
    assert len(draws) > 1                                        # positions draw differently
    assert sample(logits, [SamplingParams(temperature=5.0, top_k=1)] * 3, [1, 2, 3], [0] * 3, 0) == \
        logits.argmax(-1).tolist()


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = torch.isfinite(filter_logits(logits, 0, 0.7))
    assert kept.tolist() == [True, True, False, False]
    assert torch.isfinite(filter_logits(logits, 3, 1.0)).tolist() == [True, True, True, False]


def test_cpu_kv_budget_and_refusals():
    plane = TorchDataPlane.from_config(DataplaneConfig(device="cpu", kv_cache_gb=0.01), SMALL, 0)
    per_block = 2 * 2 * 16 * 2 * 32 * 4                # k+v, layers, block, kv heads, head dim, fp32
    assert plane.num_kv_blocks(16) == int(0.01e9 // per_block)
    with pytest.raises(ValueError, match="shape_only"):
        TorchDataPlane.from_config(DataplaneConfig(device="cpu"),
                                   dataclasses.replace(SMALL, source="shape_only"), 0)
    with pytest.raises(ValueError, match="CUDA only"):
        TorchDataPlane.from_config(DataplaneConfig(device="cpu", attention="flash_attn"), SMALL, 0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (flash-attn / bf16 path)")
def test_flash_attn_matches_torch_backend_on_cuda():
    pytest.importorskip("flash_attn", reason="flash-attn is not installed")
    cfg = SMALL
    planes = [TorchDataPlane.from_config(DataplaneConfig(device="cuda", attention=a), cfg, 0)
              for a in ("torch", "flash_attn")]
    for p in planes:
        p.allocate_kv(8, 256)
    a, b = ids(300, 7), ids(40, 8)
    batches = [entry(entry(Batch(), 0, a[:200], 0, [3, 4]), 1, b, 0, [5]),
               entry(entry(Batch(), 0, a[200:], 200, [3, 4]), 1, [int(b[0])], 40, [5])]
    for batch in batches:
        got = [p.forward(batch, all_logits=True).float() for p in planes]
        torch.testing.assert_close(got[1], got[0], atol=0.1, rtol=0.05)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (bf16 default, GPU KV sizing)")
def test_cuda_default_plane_is_bf16_sized_from_gpu_memory_and_tracks_float32(capsys):
    bf16 = TorchDataPlane.from_config(DataplaneConfig(device="cuda"), SMALL, 0)
    assert bf16.dtype == torch.bfloat16 and bf16.device.type == "cuda"
    assert bf16.num_kv_blocks(BS) > 1000 and "KV cache:" in capsys.readouterr().out
    fp32 = make_plane(SMALL)
    bf16.allocate_kv(64, BS)
    batch = entry(entry(Batch(), 0, ids(37, 1), 0, [9, 2, 30, 5, 17, 11, 40, 41, 42, 43]),
                  1, ids(12, 2), 0, [1, 3, 4])
    got, want = bf16.forward(batch, all_logits=True).float(), fp32.forward(batch, all_logits=True)
    err = (got - want).abs()                     # bf16 keeps ~3 significant digits; logits are O(few)
    assert err.max() < 0.5 and err.mean() < 0.05, (err.max(), err.mean())
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_steps_keep_sdpa_off_cudnn():
    """cuDNN's SDPA re-plans every new shape (~14 ms each): a paged batch must not reach it."""
    from torch.profiler import ProfilerActivity, profile
    plane = TorchDataPlane.from_config(DataplaneConfig(device="cuda"), SMALL, 0)
    plane.allocate_kv(64, BS)
    # a fresh prompt (causal group) and two decodes of different contexts (masked group)
    batch = entry(entry(entry(Batch(), 0, ids(21, 1), 0, [9, 2, 30, 5, 17, 11]), 1, [5], 6, [1, 3]),
                  2, [7], 9, [20, 21, 22])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        plane.forward(batch)
    ops = {e.key for e in prof.key_averages()}
    assert any("scaled_dot_product" in op or "attention" in op for op in ops), sorted(ops)
    assert not [op for op in ops if "cudnn" in op.lower()], sorted(ops)
