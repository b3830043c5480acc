"""Precision as configuration on the sim: bytes per weight and per KV element priced apart, the
GEMMs' peak per dtype, the KV capacity from the KV dtype, refusals where the GPU cannot, and every
number at the default precision exactly what it was."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hydra import compose, initialize_config_dir

from policylab.apps.cli import CONFIG_DIR
from policylab.apps.sim_check import load_group
from policylab.core.batch import Batch
from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.kernel_model import KernelCostModel
from policylab.dataplane.precision import BYTES, WEIGHT_ONLY_DEQUANT_OVERHEAD, resolve_precision
from policylab.dataplane.roofline import Roofline
from policylab.dataplane.shaped import ShapedCostModel
from policylab.dataplane.sim import SimDataPlane

pytestmark = pytest.mark.timeout(120)

LLAMA = load_group("model", "llama3-8b", ModelConfig)
H100 = load_group("hardware", "h100", HardwareConfig)
A100 = load_group("hardware", "a100", HardwareConfig)
BATCHES = [([1] * 64, [700] * 64), ([512, 1, 1], [0, 300, 900]), ([8192], [0]), ([37, 1], [1000, 5])]


def plane(hw=H100, **keys):
    return SimDataPlane(LLAMA, hw, DataplaneConfig(kind="sim", **keys))


def step(p, q, ctx):
    return p.step_time(Batch(req_ids=list(range(len(q))), query_lens=q, context_lens=ctx, sample=[True] * len(q)))


@pytest.mark.parametrize("model", [Roofline, KernelCostModel, ShapedCostModel])
def test_the_default_precision_gives_every_number_it_gave_before(model):
    native = resolve_precision(LLAMA, H100)
    assert native.native and native.weight_bytes == native.kv_bytes == LLAMA.dtype_bytes
    before, after = model(LLAMA, H100), model(LLAMA, H100, precision=native)
    for q, ctx in BATCHES:
        assert after.step_time(q, ctx, sum(q), len(q)) == before.step_time(q, ctx, sum(q), len(q))
    assert after.describe() == before.describe()          # (no precision section at the default)


def test_fp8_kv_on_h100_holds_twice_the_blocks_of_bf16_in_the_same_memory():
    bf16, fp8 = plane().num_kv_blocks(16), plane(kv_cache_dtype="fp8").num_kv_blocks(16)
    assert fp8 / bf16 >= 1.8 and fp8 == pytest.approx(2 * bf16, abs=1)
    low = dict(gpu_memory_utilization=0.3)                # a tighter memory budget: the same ratio
    assert plane(kv_cache_dtype="fp8", **low).num_kv_blocks(16) == pytest.approx(2 * plane(**low).num_kv_blocks(16), abs=1)


def test_fp8_weights_halve_the_decoder_weights_and_free_their_memory_for_kv():
    bf16, fp8 = plane(), plane(weight_dtype="fp8", compute_dtype="fp8")
    embed = 2 * LLAMA.vocab_size * LLAMA.hidden_size * 2               # untied embedding + LM head stay 16-bit
    assert fp8.shape.weight_bytes - embed == pytest.approx((bf16.shape.weight_bytes - embed) / 2)
    assert fp8.num_kv_blocks(16) > bf16.num_kv_blocks(16)
    int4 = plane(weight_dtype="int4")
    assert BYTES["int4"] == 0.5 + 2 / 128                              # 4 bits + an FP16 scale per 128 weights
    assert int4.shape.weight_bytes - embed == pytest.approx((bf16.shape.weight_bytes - embed) * BYTES["int4"] / 2)


def test_w8a8_fp8_doubles_the_gemm_peak_and_streams_half_the_weights():
    bf16 = ShapedCostModel(LLAMA, H100)
    fp8 = ShapedCostModel(LLAMA, H100, precision=resolve_precision(LLAMA, H100, "fp8", "auto", "fp8"))
    k, n = LLAMA.hidden_size, LLAMA.intermediate_size
    big = 16384                                                          # compute-bound: the FP8 peak, 2x
    assert fp8.gemm_time(big, k, n) == pytest.approx(bf16.gemm_time(big, k, n) / 2, rel=0.02)
    assert fp8.gemm_time(1, k, n) == pytest.approx(bf16.gemm_time(1, k, n) / 2, rel=0.02)    # weight streaming
    decode = ([1] * 32, [1000] * 32)
    assert fp8.step_time(*decode, 32, 32) < 0.75 * bf16.step_time(*decode, 32, 32)


def test_weight_only_int4_streams_a_quarter_but_pays_dequantisation_where_compute_bound():
    bf16 = ShapedCostModel(LLAMA, H100)
    w4 = ShapedCostModel(LLAMA, H100, precision=resolve_precision(LLAMA, H100, "int4"))
    k, n = LLAMA.hidden_size, LLAMA.intermediate_size
    assert w4.gemm_time(1, k, n) < 0.3 * bf16.gemm_time(1, k, n)                          # ~3.9x less traffic
    assert w4.gemm_time(16384, k, n) == pytest.approx(bf16.gemm_time(16384, k, n) * (1 + WEIGHT_ONLY_DEQUANT_OVERHEAD),
                                                      rel=0.01)


def test_fp8_kv_reads_half_the_bytes_in_decode_attention():
    bf16, fp8 = KernelCostModel(LLAMA, H100), KernelCostModel(LLAMA, H100,
                                                              precision=resolve_precision(LLAMA, H100, kv="fp8"))
    long = ([1] * 64, [30000] * 64)                                     # KV-bound decode
    assert fp8.attention_time(*long, 64) < 0.6 * bf16.attention_time(*long, 64)
    assert step(plane(kv_cache_dtype="fp8"), *long) < step(plane(), *long)


def test_a_gpu_without_fp8_tensor_cores_refuses_fp8_compute_in_one_line():
    with pytest.raises(ValueError, match="hardware a100 has no FP8 tensor cores.*compute_dtype=bf16 runs fp8 weights "
                                         "as W8A16"):
        plane(A100, weight_dtype="fp8", compute_dtype="fp8")
    assert plane(A100, weight_dtype="fp8").precision.gemm_speedup < 1          # the FP8 Marlin fallback runs
    assert plane(A100, kv_cache_dtype="fp8").num_kv_blocks(16) > plane(A100).num_kv_blocks(16)   # storage only
    assert plane(A100, weight_dtype="int8", compute_dtype="int8").precision.gemm_speedup == 2.0  # 624 / 312


@pytest.mark.parametrize("keys, message", [
    (dict(weight_dtype="int3"), "dataplane.weight_dtype must be one of"),
    (dict(kv_cache_dtype="int4"), "dataplane.kv_cache_dtype must be one of"),
    (dict(weight_dtype="bf16", compute_dtype="fp8"), "compute_dtype=fp8 is W8A8: it needs dataplane.weight_dtype=fp8"),
    (dict(weight_dtype="int4", compute_dtype="int4"), "dataplane.compute_dtype must be one of"),
    (dict(weight_dtype="int4", compute_dtype="int8"), "compute_dtype=int8 is W8A8"),
    (dict(weight_dtype="fp8", profile="some/dir"), "measured one precision"),
])
def test_impossible_precisions_are_refused_naming_the_key(keys, message):
    with pytest.raises(ValueError, match=message):
        plane(**keys)


def test_precision_is_recorded_with_the_cost_model():
    described = plane(weight_dtype="int4", kv_cache_dtype="fp8").describe_cost_model()
    assert described["precision"]["weight_dtype"] == "int4" and described["precision"]["kv_bytes"] == 1.0
    assert "precision" not in plane().describe_cost_model()


def test_the_presets_compose_into_the_plane_keys():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["dataplane=sim", "quant=fp8", "kv_dtype=fp8"])
        w4 = compose("config", overrides=["dataplane=sim", "quant=w4a16"])
        torch_plane = compose("config", overrides=["quant=w8a16"])
    assert (cfg.dataplane.weight_dtype, cfg.dataplane.compute_dtype, cfg.dataplane.kv_cache_dtype) == ("fp8", "fp8", "fp8")
    assert (w4.dataplane.weight_dtype, w4.dataplane.compute_dtype, w4.dataplane.kv_cache_dtype) == ("int4", "auto", "auto")
    assert torch_plane.dataplane.weight_dtype == "int8"


def test_a_quantised_model_shape_is_priced_on_tensor_parallel_shards_too():
    tp = SimDataPlane(LLAMA, H100, DataplaneConfig(kind="sim", tensor_parallel=2, weight_dtype="fp8",
                                                   compute_dtype="fp8"))
    whole = plane(weight_dtype="fp8", compute_dtype="fp8")
    assert tp.shape.weight_bytes == whole.shape.weight_bytes and tp.num_kv_blocks(16) > whole.num_kv_blocks(16)
    assert replace(tp.precision) == whole.precision


def test_the_kv_manager_moves_a_block_at_the_kv_dtype_s_bytes():
    """Every KV move the engine prices (here swap preemption over a latency-free link) costs a
    block's bytes at the KV dtype: fp8 moves each block in half bf16's time."""
    from policies.chunked import Chunked
    from policylab.core.config import EngineConfig
    from policylab.core.engine import Engine
    from policylab.core.request import TraceRequest
    trace = [TraceRequest(0.001 * i, 3000 + 500 * i, 400) for i in range(12)]
    engine = EngineConfig(block_size=16, num_blocks=1200, max_num_batched_tokens=2048, max_num_seqs=12,
                          host_kv_blocks=4000, swap_latency=0.0, swap_bandwidth=25e9)
    per_block = {}
    for dtype in ("auto", "fp8"):
        p = plane(kv_cache_dtype=dtype)
        kv = Engine(trace, Chunked(chunk_size=2048, preempt_mode="swap"), p, engine, seed=0).run().sections.get("kv_tiers")
        moved = kv["swapped_out_blocks"] + kv["swapped_in_blocks"]
        assert moved > 0
        per_block[dtype] = kv["transfer_time"] / moved
        assert per_block[dtype] == pytest.approx(p.kv_block_bytes(16) / 25e9, rel=1e-9)
    assert per_block["fp8"] == pytest.approx(per_block["auto"] / 2, rel=1e-9)
