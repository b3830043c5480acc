"""Serving-engine presets (policylab/dataplane/serving_engine.py): each term against its definition,
computed by hand; `none` is the engine-less model number for number; the presets load and bad
constants are refused by name; an engine that schedules ahead admits arrivals one step later."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from policylab.core.capabilities import Capability

from policylab.apps.config import CONFIG_DIR
from policylab.apps.sim_check import load_group
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.core.engine import Engine
from policylab.core.request import TraceRequest
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.kernel_model import KernelCostModel
from policylab.dataplane.roofline import Roofline
from policylab.dataplane.serving_engine import ServingEngine, ServingEngineConfig, check_serving_engine
from policylab.dataplane.shaped import ShapedCostModel
from policylab.dataplane.sim import SimDataPlane
from policies.vllm_v1 import VllmV1

LLAMA = load_group("model", "llama3-8b", ModelConfig)
H100 = load_group("hardware", "h100", HardwareConfig)
KiB, MiB = 2 ** 10, 2 ** 20
PRESETS = sorted(p.stem for p in (Path(CONFIG_DIR) / "serving_engine").glob("*.yaml"))


def engine(name: str, **changes) -> ServingEngine:
    return ServingEngine(replace(load_group("serving_engine", name, ServingEngineConfig), **changes))


def batches():
    return [([1] * 8, [700] * 8, 8, 8), ([512], [0], 512, 1), ([1] * 30 + [300], [900] * 30 + [200], 330, 31),
            ([2048], [4096], 2048, 1)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cls", [Roofline, KernelCostModel, ShapedCostModel])
@pytest.mark.parametrize("tp", [1, 4])
def test_the_none_engine_is_the_engine_less_model_number_for_number(cls, tp):
    plain, none = cls(LLAMA, H100, tp), cls(LLAMA, H100, tp, 1, engine("none"))
    for q, ctx, tokens, sampled in batches():
        assert none.step_time(q, ctx, tokens, sampled) == plain.step_time(q, ctx, tokens, sampled)
    assert "serving_engine" not in none.describe()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_loads_composes_and_passes_its_checks(name):
    cfg = load_group("serving_engine", name, ServingEngineConfig)
    check_serving_engine(cfg)
    assert cfg.name == name
    plane = SimDataPlane(LLAMA, H100, DataplaneConfig(kind="sim", tensor_parallel=2, serving_engine=cfg))
    assert (Capability.SCHEDULES_AHEAD in plane.capabilities) == cfg.async_scheduling
    assert plane.client_latency == cfg.client_latency


@pytest.mark.timeout(30)
def test_vllm_eager_is_vllm_without_graphs_and_with_the_eager_all_reduce_timing():
    vllm, eager = (load_group("serving_engine", n, ServingEngineConfig) for n in ("vllm", "vllm_eager"))
    assert not eager.cuda_graphs and vllm.cuda_graphs
    assert eager.one_shot_latency > vllm.one_shot_latency and eager.all_reduce == vllm.all_reduce == "custom"
    assert eager.fused_elementwise == vllm.fused_elementwise and eager.client_latency == vllm.client_latency


@pytest.mark.timeout(30)
@pytest.mark.parametrize("key, value, message", [
    ("all_reduce", "mpi", "serving_engine.all_reduce must be one of nccl, custom"),
    ("host_per_step", -1.0, "serving_engine.host_per_step must be a finite number >= 0"),
    ("client_latency", math.nan, "serving_engine.client_latency must be a finite number >= 0"),
    ("custom_all_reduce_bandwidth", 0.0, "serving_engine.custom_all_reduce_bandwidth must be null"),
    ("decode_attention_floor", math.inf, "serving_engine.decode_attention_floor must be null or a finite"),
    ("prefill_attention_efficiency", 1.5, "serving_engine.prefill_attention_efficiency must be in"),
    ("cuda_graph_max_tokens", -1, "serving_engine.cuda_graph_max_tokens must be a whole number"),
    ("async_overlap_norm", 0.5, "serving_engine.async_overlap_norm must be null"),
    ("async_overlap_norm", math.inf, "serving_engine.async_overlap_norm must be null"),
])
def test_bad_constants_are_refused_by_name(key, value, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        check_serving_engine(replace(ServingEngineConfig(), **{key: value}))


@pytest.mark.timeout(30)
def test_custom_all_reduce_follows_vllms_thresholds_and_falls_back_to_the_ring():
    e = engine("vllm", custom_all_reduce_bandwidth=100e9)
    c = e.cfg
    one = lambda tp, s: c.one_shot_latency + (tp - 1) * s / 100e9          # noqa: E731
    two = lambda tp, s: c.two_shot_latency + 2 * (tp - 1) / tp * s / 100e9   # noqa: E731
    assert e.custom_all_reduce(2, 4 * MiB, 1e9) == pytest.approx(one(2, 4 * MiB))        # 2 GPUs: always one-shot
    assert e.custom_all_reduce(4, 512 * KiB - 16, 1e9) == pytest.approx(one(4, 512 * KiB - 16))
    assert e.custom_all_reduce(4, 512 * KiB, 1e9) == pytest.approx(two(4, 512 * KiB))
    assert e.custom_all_reduce(8, 256 * KiB - 16, 1e9) == pytest.approx(one(8, 256 * KiB - 16))
    assert e.custom_all_reduce(8, 256 * KiB, 1e9) == pytest.approx(two(8, 256 * KiB))
    assert e.custom_all_reduce(4, 8 * MiB, 1e9) is None                     # >= max size: NCCL
    assert e.custom_all_reduce(3, 1 * KiB, 1e9) is None                     # unsupported world size
    link_bw = engine("vllm").custom_all_reduce(2, 1 * MiB, 329e9)           # null bandwidth: the link's
    assert link_bw == pytest.approx(c.one_shot_latency + 1 * MiB / 329e9)
    shaped = ShapedCostModel(LLAMA, H100, 4, 1, engine("vllm"))
    assert shaped.link.all_reduce(16 * MiB) == pytest.approx(
        H100.collective_latency + 6 * H100.link_latency + 1.5 * 16 * MiB / H100.link_bandwidth)


@pytest.mark.timeout(30)
def test_an_eager_engine_pays_its_collective_overhead_on_every_nccl_collective():
    plain, eager = ShapedCostModel(LLAMA, H100, 2), ShapedCostModel(LLAMA, H100, 2, 1, engine("eager_nccl"))
    for size in (1e3, 1e6):
        assert eager.link.all_reduce(size) - plain.link.all_reduce(size) == pytest.approx(100e-6)
        assert eager.link.all_gather(size) - plain.link.all_gather(size) == pytest.approx(100e-6)


@pytest.mark.timeout(30)
def test_async_scheduling_hides_host_work_and_synchronous_scheduling_adds_it():
    sync = ServingEngine(ServingEngineConfig(host_per_step=1e-3))
    overlap = ServingEngine(ServingEngineConfig(host_per_step=1e-3, async_scheduling=True))
    assert sync.step(5e-3, 0.0, 1e-3) == pytest.approx(6e-3)
    assert overlap.step(5e-3, 0.0, 1e-3) == pytest.approx(5e-3)
    assert overlap.step(0.5e-3, 0.0, 1e-3) == pytest.approx(1e-3)          # host-bound: the host sets the pace
    assert sync.step(1e-3, 3e-3, 2e-3) == pytest.approx(5e-3)               # launches overlap the kernels
    cost = ShapedCostModel(LLAMA, H100, 1, 1, overlap)
    kernels = ShapedCostModel(LLAMA, H100)
    q, ctx = [1] * 16, [1000] * 16
    assert cost.step_time(q, ctx, 16, 16) == pytest.approx(max(kernels.step_time(q, ctx, 16, 16), 1e-3))


@pytest.mark.timeout(30)
def test_a_partial_overlap_lies_between_the_max_and_the_sum_and_costs_most_where_host_and_gpu_are_equal():
    def step(p, gpu, host):
        return ServingEngine(ServingEngineConfig(async_scheduling=True, async_overlap_norm=p)).step(gpu, 0.0, host)
    assert step(2.0, 3e-3, 4e-3) == pytest.approx(5e-3)                      # (3^2 + 4^2)^(1/2)
    assert step(1.0, 3e-3, 4e-3) == pytest.approx(7e-3)                      # p = 1: nothing hidden
    assert step(None, 3e-3, 4e-3) == pytest.approx(4e-3)                     # the default: the max
    assert step(2.0, 5e-3, 0.0) == pytest.approx(5e-3)                       # no host work: the kernels
    # what the overlap loses, as a share of the max, is largest with host and GPU equal
    lost = [step(2.0, 10e-3, h) / max(10e-3, h) - 1 for h in (2e-3, 5e-3, 10e-3, 20e-3, 50e-3)]
    assert lost[2] == pytest.approx(math.sqrt(2) - 1) and lost[2] == max(lost)
    assert lost[0] < lost[1] < lost[2] > lost[3] > lost[4]
    # sync scheduling has no overlap to make partial: the combination is refused, not ignored
    with pytest.raises(ValueError, match=r"async_overlap_norm=2\.0 needs serving_engine\.async_scheduling=true"):
        ServingEngine(ServingEngineConfig(async_overlap_norm=2.0))
    # through the cost model: a decode step whose host work equals its kernels takes sqrt(2) x as long
    kernels = ShapedCostModel(LLAMA, H100).step_time([1] * 16, [1000] * 16, 16, 16)
    full = ShapedCostModel(LLAMA, H100, 1, 1, ServingEngine(ServingEngineConfig(
        async_scheduling=True, host_per_step=kernels)))
    partial = ShapedCostModel(LLAMA, H100, 1, 1, ServingEngine(ServingEngineConfig(
        async_scheduling=True, host_per_step=kernels, async_overlap_norm=2.0)))
    assert full.step_time([1] * 16, [1000] * 16, 16, 16) == pytest.approx(kernels)
    assert partial.step_time([1] * 16, [1000] * 16, 16, 16) == pytest.approx(math.sqrt(2) * kernels)


@pytest.mark.timeout(30)
def test_launches_cost_the_host_outside_graphs_only():
    e = ServingEngine(ServingEngineConfig(cuda_graphs=True, cuda_graph_max_tokens=512, kernel_launch=5e-6))
    assert e.launches(400, 256, True, 64) == pytest.approx(5e-6)            # a whole graph
    assert e.launches(400, 256, False, 64) == pytest.approx(65 * 5e-6)      # piecewise: attention launched apart
    assert e.launches(400, 1024, False, 64) == pytest.approx(400 * 5e-6)    # past the captured sizes: eager
    eager = ServingEngine(ServingEngineConfig(kernel_launch=5e-6))
    assert eager.launches(400, 8, True, 64) == pytest.approx(400 * 5e-6)


@pytest.mark.timeout(30)
def test_fused_elementwise_kernels_fold_the_adds_into_the_norms():
    fused = ShapedCostModel(LLAMA, H100, 1, 1, ServingEngine(ServingEngineConfig(fused_elementwise=True)))
    plain = ShapedCostModel(LLAMA, H100)
    s, h = plain.shape, plain.shape.hidden
    assert plain.elementwise_kernels == 6 and fused.elementwise_kernels == 4
    # norms read and write the residual too (2 x 4h), the separate adds (6h) are gone
    assert fused._elementwise_elems == s.elementwise_elems - 6 * h + 2 * 2 * h
    n = 4096
    by_hand = (n * (fused._elementwise_elems)) * s.dtype_bytes / (H100.mem_bandwidth * H100.elementwise_bw_efficiency)
    assert fused.elementwise_time(n, fused._elementwise_elems) == pytest.approx(by_hand)
    assert fused.dense_time(n) < plain.dense_time(n)


@pytest.mark.timeout(30)
def test_decode_floor_override_and_the_split_and_unsplit_kernels():
    e = ServingEngine(ServingEngineConfig(decode_attention_floor=11e-6))
    split, unsplit = (ShapedCostModel(LLAMA, H100, 1, 1, ServingEngine(ServingEngineConfig(decode_split_kv=s)))
                      for s in ("always", "never"))
    assert ShapedCostModel(LLAMA, H100, 1, 1, e).decode_floor == 11e-6
    kv = split._kv_bytes_layer
    memory = (8192 * kv + 1 * (split._qo_bytes_token + kv)) / split.bw
    assert split._decode(1, 8192) == pytest.approx(split.decode_floor + memory + split.latency)
    # unsplit: each of the 8 (request, KV head) items streams its 8,192 tokens at one SM's share of the
    # bandwidth (132 SMs), after its launch; no floor
    last_item = 8192 * (kv / 8) / (split.bw / H100.num_sms)
    assert unsplit._decode(1, 8192) == pytest.approx(unsplit.latency + memory + last_item + unsplit.latency)
    assert unsplit._decode(1, 8192) > 5 * split._decode(1, 8192)          # 8 of 132 SMs busy
    # a full batch of short requests: no merge to pay, so the unsplit kernel is the cheaper one
    assert unsplit._decode(256, 256 * 100) < split._decode(256, 256 * 100)


@pytest.mark.timeout(30)
def test_the_planned_split_switches_where_flashinfers_planner_does():
    """FlashInfer's decode planner splits only while the (request, KV head) items leave part of its grid
    (blocks per SM x SMs) idle and a request's KV is longer than one 128-token chunk."""
    a100 = load_group("hardware", "a100", HardwareConfig)
    planned, split, unsplit = (ShapedCostModel(LLAMA, a100, 4, 1, ServingEngine(ServingEngineConfig(decode_split_kv=s)))
                               for s in ("planned", "always", "never"))
    grid = a100.decode_attention_blocks_per_sm * a100.num_sms            # 324 thread blocks, 2 KV heads a GPU
    assert grid == 324 and planned.shape.kv_heads == 2
    assert planned._decode(160, 160 * 1344) == split._decode(160, 160 * 1344)        # 320 items: split
    assert planned._decode(168, 168 * 1344) == unsplit._decode(168, 168 * 1344)      # 336 items: the grid is full
    assert planned._decode(168, 168 * 1344) > 1.15 * planned._decode(160, 160 * 1344)   # Vidur: 139 -> 177 us
    assert planned._decode(2, 2 * 128) == unsplit._decode(2, 2 * 128)    # one chunk each: nothing to split
    assert planned._decode(2, 2 * 129) == split._decode(2, 2 * 129)
    assert planned._decode(1, 32) < 0.5 * split._decode(1, 32)           # Vidur: 6 us, not the 20 us floor


@pytest.mark.timeout(30)
@pytest.mark.parametrize("spelled, meant", [(True, "always"), (False, "never"), ("True", "always"),
                                            ("false", "never"), ("planned", "planned"), ("Never", "never")])
def test_decode_split_kv_takes_its_three_names_and_its_former_booleans(spelled, meant):
    engine = ServingEngine(ServingEngineConfig(decode_split_kv=spelled))
    assert engine.cfg.decode_split_kv == meant


@pytest.mark.timeout(30)
def test_an_unknown_decode_split_is_refused_by_name():
    with pytest.raises(ValueError, match=r"serving_engine.decode_split_kv must be one of always, never, planned, "
                                         r"got 'sometimes'"):
        ServingEngine(ServingEngineConfig(decode_split_kv="sometimes"))


@pytest.mark.timeout(30)
def test_split_k_fills_the_sms_of_a_sub_wave_gemm_with_large_k():
    plain = ShapedCostModel(LLAMA, replace(H100, mem_bandwidth=1e18))             # compute alone
    split = ShapedCostModel(LLAMA, replace(H100, mem_bandwidth=1e18), 1, 1,
                            ServingEngine(ServingEngineConfig(gemm_split_k=True)))
    n, k, m = 128, 8192, 2560            # 1 x 20 tiles of 128 x 128 on 132 SMs: 6 splits of K
    flops = H100.peak_flops * H100.persistent_gemm_efficiency       # the H100's GEMM rate, in every engine
    assert split.gemm_time(n, k, m) == pytest.approx(2 * k * (128 * 128 * 132 / 6) / flops, rel=1e-6)
    assert plain.gemm_time(n, k, m) == pytest.approx(2 * k * ((20 / 132) ** 0.5 * 128 * 128 * 132) / flops, rel=1e-6)
    assert split.gemm_time(n, 1024, m) == pytest.approx(plain.gemm_time(n, 1024, m))   # K too small to split
    assert split.gemm_time(4096, k, 4096) == pytest.approx(plain.gemm_time(4096, k, 4096))   # whole waves


@pytest.mark.timeout(30)
def test_flash_prefill_efficiency_matches_flashattention3s_published_curve():
    """FlashAttention-3's causal forward, head dim 128, H100 SXM5 (Shah et al. 2024, fig. 5): TFLOP/s at
    512-16k tokens with batch x length = 16k (every SM busy); the preset's curve within 5 %."""
    e = load_group("serving_engine", "vllm", ServingEngineConfig)
    published = {512: 292, 1024: 423, 2048: 521, 4096: 579, 8192: 602, 16384: 616}
    for n, tflops in published.items():
        keys = (n + 128) / 2
        share = e.prefill_attention_efficiency * keys / (keys + e.prefill_attention_tile_overhead)
        assert share * 989 == pytest.approx(tflops, rel=0.05)
    cost = ShapedCostModel(LLAMA, H100, 1, 1, ServingEngine(e))
    one = cost.attention_time([4096], [0], 4096) / LLAMA.num_hidden_layers
    pairs = 4096 * (0 + 4097 / 2)
    keys = (4096 + 128) / 2
    compute = pairs * cost._pair_flops * (keys + 385) / keys / (989e12 * 0.68)   # 32 x 32 items fill the SMs
    assert one == pytest.approx(cost.floor + compute + cost.latency)


def _replay(schedules_ahead: bool):
    class Plane(SimDataPlane):
        pass
    plane = Plane(ModelConfig(), HardwareConfig(step_overhead=0.010), DataplaneConfig(kind="sim", cost_model="roofline"))
    plane.capabilities = plane.capabilities | {Capability.SCHEDULES_AHEAD} if schedules_ahead else \
        plane.capabilities - {Capability.SCHEDULES_AHEAD}
    trace = [TraceRequest(arrival_time=0.0, prompt_tokens=16, output_tokens=20),
             TraceRequest(arrival_time=0.015, prompt_tokens=16, output_tokens=2)]
    result = Engine(trace, VllmV1(), plane, EngineConfig(num_blocks=64, max_model_len=256)).run()
    steps = result.steps
    return result, list(steps["clock"])


@pytest.mark.timeout(60)
def test_an_engine_that_schedules_ahead_admits_an_arrival_one_step_later():
    sync, sync_starts = _replay(False)
    ahead, ahead_starts = _replay(True)
    first = sync.requests[1].first_scheduled_time
    # steps of ~10 ms: the second request arrives during the second step; a synchronous scheduler takes it
    # in the third, one that schedules ahead in the fourth (the third was scheduled while the second ran)
    assert first == pytest.approx(sync_starts[2])
    assert ahead.requests[1].first_scheduled_time == pytest.approx(ahead_starts[3])
    assert ahead.requests[0].first_scheduled_time == 0.0 == sync.requests[0].first_scheduled_time   # idle: at once


@pytest.mark.timeout(30)
def test_kv_blocks_leave_the_engines_memory_on_every_gpu():
    e = load_group("serving_engine", "vllm", ServingEngineConfig)
    base = SimDataPlane(LLAMA, H100, DataplaneConfig(kind="sim", tensor_parallel=2))
    vllm = SimDataPlane(LLAMA, H100, DataplaneConfig(kind="sim", tensor_parallel=2, serving_engine=e))
    block = base.shape.kv_bytes_per_token_all_gpus() * 16
    reserve = 2 * (e.non_kv_memory + e.non_kv_memory_parallel)
    assert base.num_kv_blocks(16) - vllm.num_kv_blocks(16) == pytest.approx(reserve / block, abs=1)
    small = replace(H100, mem_bytes=16.5e9)
    with pytest.raises(ValueError, match="and the engine's 3.3 GB besides do not fit"):
        SimDataPlane(LLAMA, small, DataplaneConfig(kind="sim", serving_engine=e)).num_kv_blocks(16)


@pytest.mark.timeout(30)
def test_the_h100_preset_gives_vllm_its_own_kv_memory():
    """vLLM multiplies the memory CUDA reports (79.22 GiB on an H100, not the datasheet's 80 GB) by
    gpu_memory_utilization; its memory profile of Llama-3-8B there left 53.29 GiB for KV (PR #10511)."""
    e = load_group("serving_engine", "vllm", ServingEngineConfig)
    plane = SimDataPlane(LLAMA, H100, DataplaneConfig(kind="sim", serving_engine=e))
    kv_gib = plane.num_kv_blocks(16) * plane.shape.kv_bytes_per_token_all_gpus() * 16 / 2 ** 30
    assert kv_gib == pytest.approx(53.29, rel=2e-3)
    datasheet = SimDataPlane(LLAMA, replace(H100, mem_bytes=80e9), DataplaneConfig(kind="sim", serving_engine=e))
    assert datasheet.num_kv_blocks(16) < 0.93 * plane.num_kv_blocks(16)     # 8 % of vLLM's blocks missing


@pytest.mark.timeout(30)
def test_kv_cache_memory_bytes_sizes_the_cache_per_gpu_whatever_the_utilization():
    """vLLM's --kv-cache-memory-bytes: each GPU's KV bytes, gpu_memory_utilization ignored. Llama-3-8B
    at TP 2 keeps 4 of its 8 KV heads on a GPU: 32 layers x 2 x 4 x 128 x 2 bytes = 64 KiB a token."""
    e = load_group("serving_engine", "vllm", ServingEngineConfig)
    for utilization in (0.5, 0.9):
        plane = SimDataPlane(LLAMA, H100, DataplaneConfig(kind="sim", tensor_parallel=2, serving_engine=e,
                                                          gpu_memory_utilization=utilization,
                                                          kv_cache_memory_bytes=10 * 2 ** 30))
        assert plane.num_kv_blocks(16) == 10 * 2 ** 30 // (64 * 2 ** 10 * 16) == 10240
    too_much = SimDataPlane(LLAMA, H100, DataplaneConfig(kind="sim", kv_cache_memory_bytes=80e9))
    with pytest.raises(ValueError, match="do not fit in one h100's memory"):
        too_much.num_kv_blocks(16)
    for bad in (0, -1.0, 1e12, "10GB"):
        with pytest.raises(ValueError, match="kv_cache_memory_bytes is the KV cache's bytes on each GPU"):
            SimDataPlane(LLAMA, H100, DataplaneConfig(kind="sim", kv_cache_memory_bytes=bad))
