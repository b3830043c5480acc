"""Persistent (stream-K) Hopper GEMMs, the GPU's level where the engine's library runs them, and the
fused-MoE kernel's padded row tiles (docs/cost-model.md)."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from policylab.apps.sim_check import load_group, predict
from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.kernel_model import KernelCostModel
from policylab.dataplane.moe import expert_gemm_terms, fused_moe_block_m, padded_pairs
from policylab.dataplane.serving_engine import ServingEngine, ServingEngineConfig
from policylab.dataplane.shaped import ShapedCostModel

LLAMA = load_group("model", "llama3-8b", ModelConfig)
MIXTRAL = load_group("model", "mixtral-8x7b", ModelConfig)
H100 = load_group("hardware", "h100", HardwareConfig)
A100 = load_group("hardware", "a100", HardwareConfig)


PERSISTENT = ("none", "vllm", "vllm_eager")          # engines on a current library: persistent GEMMs
OLDER = ("vidur", "eager_nccl")                     # the library of Vidur's profiles: GEMMs in waves
ENGINES = PERSISTENT + OLDER                        # every shipped serving-engine preset


def _engine(name):
    return ServingEngine(load_group("serving_engine", name, ServingEngineConfig))


def _model(hw, engine="none", cost_model=ShapedCostModel):
    compute_only = replace(hw, mem_bandwidth=1e18)          # the compute term alone
    return cost_model(LLAMA, compute_only, 1, 1, _engine(engine))


def _efficiency(cost, hw, n, k, m):
    return 2 * n * k * m / cost.gemm_time(n, k, m) / hw.peak_flops


WAVES = replace(H100, persistent_gemm_efficiency=None)      # the same GPU priced by the wave model


def test_the_shipped_engines_are_all_named_here():
    from pathlib import Path
    from policylab.apps.config import CONFIG_DIR
    assert sorted(ENGINES) == sorted(p.stem for p in (Path(CONFIG_DIR) / "serving_engine").glob("*.yaml"))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("engine", PERSISTENT)
@pytest.mark.parametrize("cost_model", [ShapedCostModel, KernelCostModel], ids=["shaped", "kernel"])
def test_hopper_gemms_are_flat_from_one_full_wave_on_a_current_library(engine, cost_model):
    """Every engine on a current library: kernel time alone (`serving_engine=none`, what sim-check and a
    single-kernel check price) included."""
    k, m = 4096, 4096                                         # 32 column tiles of 128: 132 SMs hold 4.1 rows
    persistent, waves = _model(H100, engine, cost_model), _model(WAVES, engine, cost_model)
    for n in (640, 768, 1024, 1280, 4096):                   # from just past one wave of tiles up
        assert _efficiency(persistent, H100, n, k, m) == pytest.approx(H100.persistent_gemm_efficiency, rel=1e-3)
    # the wave model steps down after a wave boundary; the persistent one does not
    assert _efficiency(waves, H100, 640, k, m) < 0.95 * _efficiency(persistent, H100, 640, k, m)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("engine", OLDER)
@pytest.mark.parametrize("cost_model", [ShapedCostModel, KernelCostModel], ids=["shaped", "kernel"])
def test_an_older_library_prices_hopper_gemms_with_the_wave_model(engine, cost_model):
    """Vidur's H100 profiles (torch 2.2.2) step at wave boundaries: `vidur` and `eager_nccl` price the
    H100's GEMMs exactly as the GPU without a persistent level, steps included."""
    k, m = 4096, 4096
    older, waves = _model(H100, engine, cost_model), _model(WAVES, engine, cost_model)
    for n in (16, 128, 640, 768, 1000, 4096):
        assert older.gemm_time(n, k, m) == waves.gemm_time(n, k, m)
    assert "persistent_gemm_efficiency" not in older.describe()
    persistent = _model(H100, "none", cost_model)
    assert _efficiency(older, H100, 640, k, m) < 0.95 * _efficiency(persistent, H100, 640, k, m)
    if cost_model is ShapedCostModel:                       # one 128-column tile past a whole wave
        m = H100.num_sms * 128
        assert older.gemm_time(128, k, m + 128) > 1.08 * older.gemm_time(128, k, m)
        assert persistent.gemm_time(128, k, m + 128) < 1.01 * persistent.gemm_time(128, k, m)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cost_model", [ShapedCostModel, KernelCostModel], ids=["shaped", "kernel"])
def test_vidurs_library_is_kernel_time_with_the_wave_model_number_for_number(cost_model):
    """`serving_engine=vidur` (what experiments/check_*_profiles.py price Vidur's profiles in) is `none`
    on the H100 without its persistent level, whole steps included."""
    vidur = cost_model(LLAMA, H100, 1, 1, _engine("vidur"))
    waves = cost_model(LLAMA, WAVES, 1, 1, _engine("none"))
    for q, ctx in (([1] * 8, [700] * 8), ([512], [0]), ([1] * 30 + [300], [900] * 30 + [200]), ([2048], [4096])):
        assert vidur.step_time(q, ctx, sum(q), len(q)) == waves.step_time(q, ctx, sum(q), len(q))
    for n in (1, 100, 264, 640, 4096):
        assert vidur.dense_time(n) == waves.dense_time(n)
    assert vidur.dense_time(640) > 1.03 * cost_model(LLAMA, H100, 1, 1, _engine("none")).dense_time(640)


@pytest.mark.timeout(30)
def test_from_one_wave_up_the_gemm_is_the_same_on_every_current_library_below_it_split_k_is_the_engines():
    k, m = 4096, 4096
    models = {e: _model(H100, e) for e in ENGINES}
    for n in (640, 1000, 4096):
        times = {models[e].gemm_time(n, k, m) for e in PERSISTENT}
        assert len(times) == 1
    # 16 tokens: 32 tiles, a quarter of the SMs; vllm splits K over the idle ones, none does not
    assert models["vllm"].gemm_time(16, k, m) < 0.6 * models["none"].gemm_time(16, k, m)


@pytest.mark.timeout(30)
def test_sim_check_prices_h100_kernels_with_persistent_gemms():
    """`sim-check` (kernel time, no serving engine) predicts an H100 dense step with the GPU's GEMMs."""
    row = {"model": "llama3-8b", "gpu": "h100", "tp": 1, "dtype_bytes": 2, "batch": 1,
           "tokens_per_request": 640, "context": 0, "phase": "dense"}
    predicted = predict(row, "shaped", None, {})
    persistent = ShapedCostModel(LLAMA, H100, 1, 1, _engine("none"))
    assert predicted == pytest.approx(1e3 * persistent.dense_time(640))
    # 640 tokens: 5 rows of tiles, past one wave of the 4,096-column GEMMs: the wave model's partial wave costs more
    assert predicted < 0.95 * 1e3 * ShapedCostModel(LLAMA, WAVES, 1, 1, _engine("none")).dense_time(640)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("cost_model", [ShapedCostModel, KernelCostModel], ids=["shaped", "kernel"])
def test_persistent_gemms_need_a_gpu_whose_libraries_have_them(cost_model):
    assert A100.persistent_gemm_efficiency is None
    for engine in ENGINES:                                   # the A100's GEMMs stay the wave model's
        cost = _model(A100, engine, cost_model)
        if cost_model is KernelCostModel:
            assert "persistent_gemm_efficiency" not in cost.describe()
        m = 108 * 128                                        # one row of 128-wide tiles fills the 108 SMs ...
        full = cost.gemm_time(128, 4096, m)
        assert cost.gemm_time(129, 4096, m) > 1.3 * full    # ... one token more starts a new wave


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


@pytest.mark.timeout(30)
def test_the_fused_moe_kernel_pays_its_tile_overhead_and_its_looser_knee():
    """Under vLLM's fused-MoE kernel each output tile of the gate-up GEMM (K = hidden) and of the down GEMM
    (K = the expert's width) pays fused_moe_tile_overhead more of K, and compute and weights join at p = 2."""
    vllm = ShapedCostModel(MIXTRAL, H100, 2, 1, _engine("vllm"))
    s = vllm.shape
    assert (s.hidden, s.expert_f) == (4096, 7168)                     # Mixtral at TP 2
    stretch = (2 * (4096 + 800) / 4096 + (7168 + 800) / 7168) / 3
    flops, traffic = expert_gemm_terms(1024, 4096, 7168, 8, 2, 2, 2, True, False)
    compute, weights = flops * stretch / (H100.peak_flops * H100.curve_efficiency), traffic / vllm.expert_bw
    assert vllm.expert_time(flops, traffic) == pytest.approx((compute ** 2 + weights ** 2) ** 0.5, rel=1e-12)
    # without the engine's kernel (kernel time of a plain grouped GEMM): the dense GEMM's terms, unchanged
    plain = ShapedCostModel(MIXTRAL, H100, 2, 1, _engine("none"))
    bare = flops / (H100.peak_flops * H100.curve_efficiency)
    assert plain.expert_time(flops, traffic) == pytest.approx((bare ** 4 + weights ** 4) ** 0.25, rel=1e-12)
    assert vllm.expert_time(flops, traffic) > 1.2 * plain.expert_time(flops, traffic)
    # a weight-streaming decode step barely notices it
    small = expert_gemm_terms(16, 4096, 7168, 8, 2, 2, 2, True, False)
    assert vllm.expert_time(*small) < 1.01 * plain.expert_time(*small)


@pytest.mark.timeout(60)
def test_the_fused_moe_kernel_against_vllms_own_timings_of_it():
    """vLLM PR #24700 (Mixtral TP 2, H100) and PR #44818 (Gemma-4's experts, H200): the kernel's terms
    against a dense GEMM's (experiments/check_moe_kernels.py)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    from check_moe_kernels import errors, summary
    shipped = load_group("serving_engine", "vllm", ServingEngineConfig).fused_moe_tile_overhead
    mape, worst = summary(errors(shipped, 2.0))
    dense_mape, dense_worst = summary(errors(0.0, 4.0))
    assert mape < 0.06 and abs(worst) < 0.15                         # measured: 4.6 %, -12.9 %
    assert dense_mape > 2.5 * mape and dense_worst < -0.35            # measured: 16.4 %, -43 %


@pytest.mark.timeout(30)
def test_a_tile_overhead_without_the_fused_moe_kernel_is_refused_not_ignored():
    with pytest.raises(ValueError, match=r"fused_moe_tile_overhead=500\.0 needs serving_engine\.fused_moe_tiles=true"):
        ServingEngine(ServingEngineConfig(fused_moe_tile_overhead=500.0))
    tuned = ShapedCostModel(MIXTRAL, H100, 2, 1, ServingEngine(ServingEngineConfig(fused_moe_tiles=True,
                                                                                   fused_moe_tile_overhead=0.0)))
    assert tuned._expert_stretch == 1.0 and tuned._expert_p == 2.0   # 0 with the kernel: no overhead, its knee kept


@pytest.mark.timeout(30)
@pytest.mark.parametrize("value", [-1.0, float("inf"), "many"])
def test_a_bad_fused_moe_tile_overhead_is_refused_by_name(value):
    with pytest.raises(ValueError, match="serving_engine.fused_moe_tile_overhead must be a finite number >= 0"):
        ServingEngine(ServingEngineConfig(fused_moe_tile_overhead=value))
