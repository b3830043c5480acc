"""vLLM's default (untuned) fused-MoE tiles: `serving_engine.fused_moe_config=default` prices the routed
experts as the kernel runs where vLLM ships no tuned configuration for the GPU (docs/cost-model.md)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from policylab.apps.sim_check import load_group
from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.moe import expert_gemm_terms, experts_touched
from policylab.dataplane.serving_engine import ServingEngine, ServingEngineConfig, check_serving_engine
from policylab.dataplane.shaped import ShapedCostModel

QWEN3_MOE = load_group("model", "qwen3-30b-a3b", ModelConfig)
LLAMA = load_group("model", "llama3-8b", ModelConfig)
B200 = load_group("hardware", "b200", HardwareConfig)
H100 = load_group("hardware", "h100", HardwareConfig)
VLLM = load_group("serving_engine", "vllm", ServingEngineConfig)
# vLLM PR #31448: benchmark_moe on one B200, Qwen3-30B-A3B's experts (E 128, width 768, top-8, bf16) on
# vLLM's default configuration, kernel time by token count
MEASURED_DEFAULT_B200 = {1: 39.61e-6, 2: 51.87e-6, 4: 73.18e-6}
FUSED_MOE_KERNELS = 4      # the two expert GEMMs, the alignment and the sum: launches the layer already pays


def _cost(hw, model=QWEN3_MOE, **engine):
    return ShapedCostModel(model, hw, 1, 1, ServingEngine(replace(VLLM, **engine)))


def _routed_experts(cost, n):
    """The routed experts' two grouped GEMMs in one MoE layer of `cost`, as priced (the floor included)."""
    s = cost.shape
    flops, traffic = expert_gemm_terms(n, s.hidden, s.expert_f, s.experts, s.top_k, s.dtype_bytes,
                                       s.weight_elem_bytes, cost.engine.cfg.fused_moe_tiles)
    return cost.moe_layer_time(n) - _cost(B200).moe_layer_time(n) + _cost(B200).expert_time(flops, traffic)


def test_the_shipped_vllm_engine_runs_tuned_tiles():
    assert VLLM.fused_moe_config == "tuned"


@pytest.mark.parametrize("tokens", sorted(MEASURED_DEFAULT_B200))
def test_default_tiles_on_the_b200_reproduce_the_measured_kernel(tokens):
    cost = _cost(B200, fused_moe_config="default")
    predicted = _routed_experts(cost, tokens) + FUSED_MOE_KERNELS * B200.kernel_latency
    assert predicted == pytest.approx(MEASURED_DEFAULT_B200[tokens], rel=0.03)


def test_default_tiles_are_slower_by_the_floor_and_more_with_every_expert_touched():
    tuned, default = _cost(B200), _cost(B200, fused_moe_config="default")
    gaps = [default.moe_layer_time(n) - tuned.moe_layer_time(n) for n in (1, 4, 16, 64, 256)]
    assert all(g > B200.fused_moe_default_floor for g in gaps)
    assert gaps == sorted(gaps)                              # more experts' weights streamed more slowly
    touched = experts_touched(256, 128, 8) / experts_touched(1, 128, 8)
    assert gaps[-1] - B200.fused_moe_default_floor > 0.5 * touched * (gaps[0] - B200.fused_moe_default_floor)


def test_a_dense_model_is_unaffected():
    tuned, default = _cost(B200, LLAMA), _cost(B200, LLAMA, fused_moe_config="default")
    for n in (1, 32, 512):
        assert default.step_time([n], [0], n, 1) == tuned.step_time([n], [0], n, 1)


def test_a_gpu_without_a_measurement_is_refused_naming_it():
    with pytest.raises(ValueError, match="hardware 'h100' has no measurement.*fused_moe_default"):
        _cost(H100, fused_moe_config="default")


def test_an_unknown_setting_is_refused():
    with pytest.raises(ValueError, match="fused_moe_config must be one of tuned, default, got 'fast'"):
        check_serving_engine(replace(VLLM, fused_moe_config="fast"))


def test_default_tiles_take_vllms_default_row_tile():
    """get_default_config: 16-row tiles up to one token per expert, 64 beyond (the tuned table differs)."""
    from policylab.dataplane.moe import fused_moe_block_m
    assert [fused_moe_block_m(n, 128, default_tiles=True) for n in (1, 100, 128, 129, 4096)] == [16, 16, 16, 64, 64]
    assert fused_moe_block_m(100) == 32 and fused_moe_block_m(4096) == 128
