"""Precision on the real plane: weights stored in INT8 / FP8 / INT4, an FP8 KV cache with per-token
scales, and the quality reference that scores a quantised replay against full precision."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from policies.chunked import Chunked
from policylab.apps.sim_check import load_group
from policylab.core.config import EngineConfig, ModelConfig
from policylab.core.engine import Engine
from policylab.core.request import TraceRequest
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.kv_quant import decode, encode
from policylab.dataplane.quant_linear import QuantLinear, quantize_tokens
from policylab.dataplane.torch_plane import TorchDataPlane

pytestmark = pytest.mark.timeout(300)

TINY = load_group("model", "tiny", ModelConfig)


def torch_plane(**keys):
    # steps timed by the cost model: which requests share a batch never depends on this machine's speed
    dp = DataplaneConfig(kind="torch", device="cpu", threads=1, step_time="model", **keys)
    return TorchDataPlane.from_config(dp, TINY, seed=0)


@pytest.mark.parametrize("dtype, storage, tolerance", [("int8", torch.int8, 0.01), ("fp8", torch.float8_e4m3fn, 0.05),
                                                       ("int4", torch.uint8, 0.15)])
def test_quantised_weights_are_stored_small_and_dequantise_close(dtype, storage, tolerance):
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 96, bias=False)
    q = QuantLinear(linear, dtype)
    assert q.qweight.dtype == storage
    assert q.weight_bytes() < linear.weight.numel() * (1.2 if dtype != "int4" else 0.7)     # vs 4-byte floats: far less
    error = (q.dequantized() - linear.weight).norm() / linear.weight.norm()
    assert 0 < error < tolerance
    x = torch.randn(5, 256)
    assert torch.allclose(q(x), torch.nn.functional.linear(x, q.dequantized()), atol=1e-4)


def test_w8a8_rounds_each_token_s_activations_at_its_own_scale():
    x = torch.tensor([[1.0, -0.5, 0.25], [100.0, 3.0, -7.0]])
    q = quantize_tokens(x, "int8")
    assert q[0, 0] == 1.0 and q[1, 0] == 100.0                              # each row's max is exact
    assert torch.allclose(q, x, rtol=0.01, atol=100 / 127 / 2 + 1e-6) and not torch.equal(q, x)


def test_an_fp8_cache_row_holds_e4m3_values_and_their_scale():
    x = torch.randn(7, 32) * torch.tensor([1e-3, 1.0, 50.0, 1e3, 2.0, 0.1, 7.0])[:, None]
    rows = encode(x)
    assert rows.dtype == torch.uint8 and rows.shape == (7, 36)
    back = decode(rows, torch.float32)
    assert (back - x).abs().max(-1).values.le(x.abs().max(-1).values / 16).all()      # 3 mantissa bits, per row
    assert not torch.equal(back, x)


def test_an_fp8_kv_cache_holds_more_blocks_in_the_same_memory():
    full, fp8 = torch_plane(), torch_plane(kv_cache_dtype="fp8")
    head_dim = TINY.hidden_size // TINY.num_attention_heads
    assert fp8.num_kv_blocks(16) == pytest.approx(full.num_kv_blocks(16) * 4 * head_dim / (head_dim + 4), rel=1e-3)
    fp8.allocate_kv(64, 16)
    assert fp8.kv.dtype == torch.uint8 and fp8.kv.shape[-1] == head_dim + 4


def trace(n=12):
    return [TraceRequest(0.01 * i, 40 + 13 * i, 20) for i in range(n)]


def replay(plane, n=12):
    return Engine(trace(n), Chunked(chunk_size=64), plane, EngineConfig(num_blocks=200, max_num_batched_tokens=128),
                  seed=0).run()


def test_the_quality_reference_of_an_unquantised_model_agrees_exactly():
    plane = torch_plane(quality_reference="always")
    replay(plane)
    q = plane.quality_report()
    assert q["positions"] > 200 and q["greedy_agreement"] == 1.0
    assert q["logit_rmse"] == 0.0 and q["kl_divergence"] == pytest.approx(0.0, abs=1e-9)


def test_quantised_replays_lose_quality_in_the_order_of_their_bits():
    reports = {}
    for name, keys in (("int8", dict(weight_dtype="int8")), ("fp8kv", dict(kv_cache_dtype="fp8")),
                       ("int4", dict(weight_dtype="int4"))):
        plane = torch_plane(**keys)                          # quality_reference=auto: on for a quantised plane
        replay(plane, 8)
        reports[name] = plane.quality_report()
    for r in reports.values():
        assert r["positions"] > 100 and 0 < r["logit_rmse"] and r["kl_divergence"] > 0
    assert reports["int8"]["kl_divergence"] < reports["int4"]["kl_divergence"]
    assert reports["int8"]["logit_rmse"] < reports["int4"]["logit_rmse"]
    assert reports["int4"]["greedy_agreement"] < 1.0


def test_forks_copy_an_fp8_block_with_its_scales():
    plane = torch_plane(kv_cache_dtype="fp8", quality_reference="never")
    plane.allocate_kv(8, 16)
    plane.kv.random_(0, 120)
    plane.copy_kv_blocks([1], [5])
    assert torch.equal(plane.kv[:, :, :, 5], plane.kv[:, :, :, 1])


def test_the_real_plane_refuses_what_it_does_not_implement():
    with pytest.raises(ValueError, match="the real plane runs auto, int8, fp8, int4"):
        torch_plane(weight_dtype="bf16")
    with pytest.raises(ValueError, match="compute_dtype=int8 is W8A8"):
        torch_plane(compute_dtype="int8")
    with pytest.raises(ValueError, match="kv_cache_dtype=fp8 is stored by the torch attention backend only"):
        TorchDataPlane.from_config(replace(DataplaneConfig(kind="torch", device="cpu", kv_cache_dtype="fp8"),
                                           attention="flash_attn"), TINY, 0)
