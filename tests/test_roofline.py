"""The roofline's form (roofline.py): the kernel latency, phi-2's block, and the hardware files that
carry each GPU's measured numbers. Its error against measured profiles: tests/test_sim_profile.py
and experiments/check_roofline_profiles.py."""
from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path

import pytest
import yaml

from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.roofline import ModelShape, Roofline

ROOT = Path(__file__).resolve().parents[1]
PHI2 = ModelConfig(architecture="phi", hidden_size=2560, intermediate_size=10240, num_hidden_layers=32,
                   num_attention_heads=32, num_key_value_heads=32, vocab_size=51200, tie_word_embeddings=False)


def hardware_file(name: str) -> dict:
    data = yaml.safe_load((ROOT / "configs" / "hardware" / f"{name}.yaml").read_text())
    return {k: float(v) if isinstance(v, str) and v[:1].isdigit() else v for k, v in data.items()}


def test_every_kernel_costs_the_latency_once():
    model = ModelConfig()
    slow = Roofline(model, HardwareConfig(kernel_latency=5e-6))
    fast = Roofline(model, HardwareConfig(kernel_latency=0.0))
    kernels = model.num_hidden_layers * ModelShape(model).kernels_per_layer + 1          # + the embedding
    assert ModelShape(model).kernels_per_layer == 10          # QKV, O, up, down, 2 norms, RoPE, SiLU·mul, 2 adds
    for n in (1, 512):
        assert slow.dense_time(n) - fast.dense_time(n) == pytest.approx(kernels * 5e-6)
    assert slow.lm_head_time(3) - fast.lm_head_time(3) == pytest.approx(5e-6) and slow.lm_head_time(0) == 0.0
    assert slow.attention_time([1, 1], [100, 200], 2) - fast.attention_time([1, 1], [100, 200], 2) == \
        pytest.approx(model.num_hidden_layers * 5e-6)


def test_phi_is_a_gelu_mlp_in_a_parallel_block():
    phi, llama = ModelShape(PHI2), ModelShape(ModelConfig(**{**asdict(PHI2), "architecture": "llama"}))
    h, f = 2560, 10240
    assert phi.gemms[2] == (h, f) and llama.gemms[2] == (h, 2 * f)          # one up projection, no gate
    assert phi.kernels_per_layer == llama.kernels_per_layer - 1             # one LayerNorm, not two
    assert llama.elementwise_elems - phi.elementwise_elems == 2 * h + f     # a norm (h in, h out), GELU f in f out
    assert llama.dense_params - phi.dense_params == 32 * h * f


@pytest.mark.parametrize("gpu", ["a100", "a40", "h100", "h200", "b200", "mi300x", "l40s"])
def test_each_gpu_file_gives_every_roofline_number(gpu):
    data = hardware_file(gpu)
    assert set(data) == {f.name for f in fields(HardwareConfig)}
    assert 0.5 < data["flops_efficiency"] < 1 and 0.5 < data["bw_efficiency"] < 1
    assert 1e-6 < data["kernel_latency"] < 1e-5


def test_the_defaults_are_the_h100_file_and_the_h200_carries_the_h100_efficiencies():
    h100, h200 = hardware_file("h100"), hardware_file("h200")
    # but persistent GEMMs: a GPU has them only where its preset declares them (a partial spec does not)
    assert asdict(HardwareConfig()) == {**h100, "persistent_gemm_efficiency": None}
    for field in ("flops_efficiency", "bw_efficiency", "kernel_latency"):
        assert h200[field] == h100[field]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tensor_parallel_pays_two_ring_all_reduces_of_the_hidden_state_per_layer(tp):
    """Between two links that differ only in their numbers, every shard's kernels cost the same: the
    step's difference is two ring all-reduces (attention output, MLP down) of the n tokens' hidden
    state per layer, and one for the vocabulary-parallel embedding, each collective latency + 2(tp-1) hops + 2(tp-1)/tp of the bytes over the
    bandwidth (NCCL's ring). One GPU has no collective: the link does not matter."""
    from dataclasses import replace
    model = ModelConfig()
    fast = HardwareConfig(link_bandwidth=100e9, link_latency=1e-6, collective_latency=20e-6)
    slow = replace(fast, link_bandwidth=25e9, link_latency=3e-6, collective_latency=50e-6)

    def ring(hw, size):
        return hw.collective_latency + 2 * (tp - 1) * hw.link_latency + 2 * (tp - 1) / tp * size / hw.link_bandwidth

    on_fast, on_slow = Roofline(model, fast, tp=tp), Roofline(model, slow, tp=tp)
    for n in (1, 512):
        size = n * model.hidden_size * model.dtype_bytes
        want = (2 * model.num_hidden_layers + 1) * (ring(slow, size) - ring(fast, size)) if tp > 1 else 0.0
        assert on_slow.dense_time(n) - on_fast.dense_time(n) == pytest.approx(want, rel=1e-9, abs=1e-15)
