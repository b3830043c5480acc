"""Persistent (stream-K) Hopper GEMMs and the fused-MoE kernel's padded row tiles (docs/cost-model.md)."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from policylab.apps.sim_check import load_group
from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.moe import expert_gemm_terms, fused_moe_block_m, padded_pairs
from policylab.dataplane.serving_engine import ServingEngine, ServingEngineConfig
from policylab.dataplane.shaped import ShapedCostModel

LLAMA = load_group("model", "llama3-8b", ModelConfig)
MIXTRAL = load_group("model", "mixtral-8x7b", ModelConfig)
H100 = load_group("hardware", "h100", HardwareConfig)
A100 = load_group("hardware", "a100", HardwareConfig)


def _model(hw, **engine):
    compute_only = replace(hw, mem_bandwidth=1e18)          # the compute term alone
    return ShapedCostModel(LLAMA, compute_only, 1, 1, ServingEngine(ServingEngineConfig(**engine)))


def _efficiency(cost, hw, n, k, m):
    return 2 * n * k * m / cost.gemm_time(n, k, m) / hw.peak_flops


@pytest.mark.timeout(30)
def test_persistent_hopper_gemms_are_flat_from_one_full_wave():
    k, m = 4096, 4096                                         # 32 column tiles of 128: 132 SMs hold 4.1 rows
    persistent, waves = _model(H100, gemm_persistent=True), _model(H100)
    for n in (640, 768, 1024, 1280, 4096):                   # from just past one wave of tiles up
        assert _efficiency(persistent, H100, n, k, m) == pytest.approx(H100.persistent_gemm_efficiency, rel=1e-3)
    # the wave model steps down after a wave boundary; the persistent one does not
    assert _efficiency(waves, H100, 640, k, m) < 0.9 * _efficiency(persistent, H100, 640, k, m)


@pytest.mark.timeout(30)
def test_persistent_gemms_need_a_gpu_whose_libraries_have_them():
    assert A100.persistent_gemm_efficiency is None
    on, off = _model(A100, gemm_persistent=True), _model(A100)
    for n in (16, 640, 4096):
        assert on.gemm_time(n, 4096, 4096) == pytest.approx(off.gemm_time(n, 4096, 4096))


@pytest.mark.timeout(30)
def test_padded_pairs_match_sampled_routing():
    rng = random.Random(0)
    for tokens in (16, 103, 128, 600):
        block = fused_moe_block_m(tokens)
        samples = []
        for _ in range(400):
            counts = [0] * 8
            for _ in range(tokens):
                for e in rng.sample(range(8), 2):             # top-2 of 8, uniform
                    counts[e] += 1
            samples.append(sum(-(-c // block) * block for c in counts))
        expected = padded_pairs(tokens, 8, 2, block)
        assert expected >= 2 * tokens
        assert expected == pytest.approx(sum(samples) / len(samples), rel=0.02)


@pytest.mark.timeout(30)
def test_fused_moe_flops_grow_with_padded_tiles_but_not_the_weights():
    s = 4096, 14336 // 2, 8, 2, 2
    for tokens in (64, 128, 512):
        plain_flops, plain_bytes = expert_gemm_terms(tokens, *s)
        tiled_flops, tiled_bytes = expert_gemm_terms(tokens, *s, fused_tiles=True)
        rows = padded_pairs(tokens, 8, 2, fused_moe_block_m(tokens))
        assert tiled_flops / plain_flops == pytest.approx(rows / (2 * tokens))
        assert tiled_bytes == plain_bytes                     # weights once per touched expert
    # compute-bound, a step of 128 Mixtral decodes costs more in padded 64-row tiles (~32 tokens an expert)
    hw = replace(H100, mem_bandwidth=1e18)
    tiled = ShapedCostModel(MIXTRAL, hw, 2, 1, ServingEngine(ServingEngineConfig(fused_moe_tiles=True)))
    plain = ShapedCostModel(MIXTRAL, hw, 2, 1, ServingEngine(ServingEngineConfig()))
    assert tiled.moe_layer_time(128) > 1.5 * plain.moe_layer_time(128) - plain.moe_layer_time(1)
