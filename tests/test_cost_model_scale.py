"""The sim's cost model at production scale: tensor and pipeline parallelism, host time, MoE and
MLA shapes, the kernel cost model's GEMM and attention terms, and the sim-check tool."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from policylab.apps import sim_check
from policylab.apps.config import CONFIG_DIR
from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.kernel_model import KernelCostModel
from policylab.dataplane.moe import experts_touched
from policylab.dataplane.parallel import Link
from policylab.dataplane.roofline import Roofline
from policylab.dataplane.sim import SimDataPlane



def model(name: str) -> ModelConfig:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig),
                                               OmegaConf.load(Path(CONFIG_DIR) / "model" / f"{name}.yaml")))


def hardware(name: str, **host) -> HardwareConfig:
    hw = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(HardwareConfig),
                                             OmegaConf.load(Path(CONFIG_DIR) / "hardware" / f"{name}.yaml")))
    return replace(hw, **host)


LLAMA = model("llama3-8b")


def decode(cost, batch=1, context=1000):
    return cost.step_time([1] * batch, [context] * batch, batch, batch)


def test_ring_all_reduce_follows_the_ring_formula_and_is_free_on_one_gpu():
    hw = hardware("h100")
    size = 8 * 4096 * 2
    for p in (2, 4, 8):
        expected = hw.collective_latency + 2 * (p - 1) * hw.link_latency + 2 * (p - 1) / p * size / hw.link_bandwidth
        assert Link(hw, p).all_reduce(size) == pytest.approx(expected)
    assert Link(hw, 1).all_reduce(size) == 0.0


def test_tensor_parallel_shards_the_work_and_adds_two_all_reduces_per_layer():
    hw = hardware("h100")
    tp1, tp2 = Roofline(LLAMA, hw), Roofline(LLAMA, hw, tp=2)
    n = 4096
    comm = (2 * 32) * tp2.link.all_reduce(n * 4096 * 2)
    # the shard's GEMMs do half the FLOPs: a FLOP-bound layer stack takes about half the time
    assert (tp2.layers_time(n) - comm) / tp1.layers_time(n) == pytest.approx(0.5, abs=0.06)
    # decode at batch 1 streams half the weights but pays 65 all-reduces: faster, not 2x faster
    assert decode(tp1) / 2 < decode(tp2) < decode(tp1)
    # a floor that does not shrink with TP: TP 8's batch-1 decode is within 2x of TP 2's
    tp8 = Roofline(LLAMA, hw, tp=8)
    assert decode(tp2) / 2 < decode(tp8) < decode(tp2)


def test_tensor_parallel_works_from_the_sim_plane_with_both_cost_models_and_gives_more_kv():
    hw = hardware("h100")
    base = SimDataPlane(LLAMA, hw, DataplaneConfig(kind="sim")).num_kv_blocks(16)
    for cost_model in ("roofline", "kernel"):
        plane = SimDataPlane(LLAMA, hw, DataplaneConfig(kind="sim", tensor_parallel=4, cost_model=cost_model))
        assert plane.num_kv_blocks(16) > 4 * base                # 4 GPUs' memory, the weights once
        info = plane.describe_cost_model()
        assert info["kind"] == cost_model and info["tensor_parallel"] == 4 and info["link"]["name"] == "nvlink4"


def test_pipeline_stages_help_a_large_batch_but_not_a_single_request():
    hw = hardware("h100")
    pp1, pp4 = Roofline(LLAMA, hw), Roofline(LLAMA, hw, pp=4)
    one = ([2048], [0], 2048, 1)
    assert pp4.step_time(*one) > pp1.step_time(*one)            # one request: the stages run in turn
    many = ([512] * 8, [0] * 8, 4096, 8)
    assert pp4.step_time(*many) < 0.6 * pp1.step_time(*many)    # 4 micro-batches: bubble (pp-1)/m


def test_host_time_adds_fixed_per_request_and_per_token_terms():
    hw = hardware("h100")
    kernels = Roofline(LLAMA, hw)
    host = Roofline(LLAMA, replace(hw, step_overhead=1e-3, host_per_request=20e-6, host_per_token=1e-6, host="x"))
    for batch in (1, 32):
        assert decode(host, batch) - decode(kernels, batch) == pytest.approx(1e-3 + batch * 21e-6)
    assert host.describe()["host_time"] == {"preset": "x", "per_step": 1e-3, "per_request": 20e-6, "per_token": 1e-6}
    eager = OmegaConf.load(Path(CONFIG_DIR) / "serving_engine" / "eager_nccl.yaml")
    assert eager.host_per_step > 0 and eager.name == "eager_nccl" and not eager.async_scheduling


def test_the_default_roofline_keeps_its_record_and_fast_path():
    cost = Roofline(LLAMA, hardware("h100"))
    assert "step_time" not in vars(cost)                          # the class's own step_time, no wrapper
    assert set(cost.describe()) == {"kind", "hardware", "flops_efficiency", "bw_efficiency", "kernel_latency",
                                    "step_overhead", "p_norm"}


def test_expected_distinct_experts_under_top_k_routing():
    assert experts_touched(1, 8, 2) == pytest.approx(2)
    assert experts_touched(1, 128, 8) == pytest.approx(8)
    assert experts_touched(10_000, 128, 8) == pytest.approx(128)
    values = [experts_touched(n, 128, 8) for n in (1, 2, 4, 16, 64)]
    assert values == sorted(values) and values[-1] < 128


def test_moe_decode_cost_grows_with_batch_where_a_dense_model_stays_flat():
    hw = hardware("h100")
    dense = Roofline(LLAMA, hw)
    moe = Roofline(model("qwen3-30b-a3b"), hw)
    assert decode(moe, 32) / decode(moe, 1) > 2 * decode(dense, 32) / decode(dense, 1)
    mixtral = SimDataPlane(model("mixtral-8x7b"), hw, DataplaneConfig(kind="sim", tensor_parallel=2))
    assert mixtral.shape.weight_bytes == pytest.approx(2 * 46.7e9, rel=0.01)     # 46.7B parameters, bf16


def test_mla_caches_one_latent_per_token_and_deepseek_v3_fits_eight_h200s():
    ds = model("deepseek-v3")
    plane = SimDataPlane(ds, hardware("h200"), DataplaneConfig(kind="sim", tensor_parallel=8))
    assert plane.shape.kv_bytes_per_token == 61 * (512 + 64) * 1
    assert plane.shape.weight_bytes == pytest.approx(671e9, rel=0.02)
    with pytest.raises(ValueError, match="do not fit in 2 x h200"):
        SimDataPlane(ds, hardware("h200"), DataplaneConfig(kind="sim", tensor_parallel=2)).num_kv_blocks(16)


def test_kernel_gemm_efficiency_rises_with_tokens_and_reaches_the_configured_share():
    hw = hardware("h100")
    cost = KernelCostModel(LLAMA, hw)
    k, m = 4096, 14336 * 2
    big = 16384
    achieved = 2 * big * k * m / cost.gemm_time(big, k, m) / hw.peak_flops
    assert achieved == pytest.approx(hw.gemm_efficiency, rel=0.05)
    per_token = [cost.gemm_time(n, k, m) / n for n in (1, 16, 256, 4096)]
    assert per_token == sorted(per_token, reverse=True)


def test_kernel_attention_has_a_floor_and_converges_to_flops_at_long_context():
    hw = hardware("h100")
    cost = KernelCostModel(LLAMA, hw)
    short = cost.attention_time([1], [64], 1) / 32
    assert short >= hw.attention_floor
    n = 16384
    long = cost.attention_time([n], [0], n) / 32
    ideal = 4 * 4096 * n * n / 2 / (hw.peak_flops * hw.attention_efficiency)
    assert long == pytest.approx(ideal, rel=0.05)
    # decode over a million KV tokens is bandwidth-bound: within 10 % of the bytes' time
    big = cost.attention_time([1] * 256, [4096] * 256, 256) / 32
    assert big == pytest.approx(256 * 4097 * 8 * 128 * 2 * 2 / (hw.mem_bandwidth * hw.bw_efficiency), rel=0.1)


def test_new_gpus_run_with_both_cost_models():
    for gpu in ("b200", "mi300x", "l40s"):
        for cost_model in ("roofline", "kernel"):
            plane = SimDataPlane(LLAMA, hardware(gpu), DataplaneConfig(kind="sim", cost_model=cost_model))
            assert 0 < decode(plane.cost_model) < 0.05 and plane.num_kv_blocks(16) > 0


def test_sim_check_reports_each_phase_on_the_shipped_sample(tmp_path, capsys):
    png = tmp_path / "check.png"
    assert sim_check.main(["--sample", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| dense |"))
    mape = float(row.split("|")[3].strip().rstrip(" %"))
    assert mape < 4.0 and png.stat().st_size > 1000                # the default (shaped): 3.3 % on Vidur's A100


def test_sim_check_prices_whole_steps_and_names_bad_cells(tmp_path, capsys):
    good = tmp_path / "m.csv"
    good.write_text("model,gpu,tp,dtype,phase,batch,tokens_per_request,context,measured_ms\n"
                    "llama3-8b,h100,2,bf16,decode,8,1,1000,6.0\nllama3-8b,h100,1,bf16,prefill,1,2048,0,50\n")
    assert sim_check.main([str(good), "--serving-engine", "vllm"]) == 0
    out = capsys.readouterr().out
    assert "| decode | 1 |" in out and "| prefill | 1 |" in out and "| all | 2 |" in out
    bad = tmp_path / "bad.csv"
    bad.write_text("model,gpu,tp,dtype,phase,batch,tokens_per_request,context,measured_ms\n"
                   "llama3-8b,h100,1,bf16,decode,eight,1,1000,6.0\n")
    assert sim_check.main([str(bad)]) == 2
    assert "bad.csv:2: column 'batch': expected an integer from 1 to 65,536, got \"eight\"" in capsys.readouterr().err
    unknown = tmp_path / "unknown.csv"
    unknown.write_text("model,gpu,tp,dtype,phase,batch,tokens_per_request,context,measured_ms\n"
                       "llama3-8b,h1000,1,bf16,decode,1,1,1000,6.0\n")
    assert sim_check.main([str(unknown)]) == 2
    assert "unknown.csv:2: column 'gpu': 'h1000': no preset in its name (did you mean h100?)" in capsys.readouterr().err
    named = tmp_path / "named.csv"                  # models and GPUs by the names they go by
    named.write_text("model,gpu,tp,dtype,phase,batch,tokens_per_request,context,measured_ms\n"
                     "meta-llama/Meta-Llama-3-8B,NVIDIA H100 80GB HBM3,2,bf16,decode,8,1,1000,6.0\n"
                     "llama3-8b,h100,2,bf16,decode,8,1,1000,6.0\n")
    assert sim_check.main([str(named), "--serving-engine", "vllm"]) == 0
    assert "| decode | 2 |" in capsys.readouterr().out
    by_name, by_preset = sim_check.read_rows(named)
    assert (by_name["model"], by_name["gpu"]) == ("llama3-8b", "h100")
    assert sim_check.predict(by_name, "shaped", "vllm", {}) == sim_check.predict(by_preset, "shaped", "vllm", {})
    quantized = tmp_path / "quantized.csv"
    quantized.write_text("model,gpu,tp,dtype,phase,batch,tokens_per_request,context,measured_ms\n"
                         "Llama-2-70B-AWQ,h100,2,bf16,decode,8,1,1000,6.0\n")
    assert sim_check.main([str(quantized)]) == 2
    assert "quantized.csv:2: column 'model': \"Llama-2-70B-AWQ\" names no configs/model preset" in capsys.readouterr().err


def test_sim_check_prices_a_mixed_step_as_one_batch_of_decodes_and_a_prefill_chunk(tmp_path, capsys):
    """A mixed row (a chunked-prefill step: `batch` decodes and one fresh chunk) costs more than
    either part alone and less than the two as separate steps: the weights are read once."""
    header = "model,gpu,tp,dtype,phase,batch,tokens_per_request,context,measured_ms\n"
    rows = {phase: f"llama3-8b,h100,1,bf16,{phase},{b},{n},{c},10.0\n" for phase, b, n, c in
            (("mixed", 32, 512, 1500), ("decode", 32, 1, 1500), ("prefill", 1, 512, 0))}
    predicted = {}
    for phase, row in rows.items():
        path = tmp_path / f"{phase}.csv"
        path.write_text(header + row)
        assert sim_check.main([str(path), "--serving-engine", "vllm"]) == 0
        line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(f"| {phase} | 1 |"))
        bias = float(line.split("|")[4].strip().rstrip(" %"))      # predicted / 10 ms - 1, in %
        predicted[phase] = 10.0 * (1 + bias / 100)
    assert max(predicted["decode"], predicted["prefill"]) < predicted["mixed"] \
        < predicted["decode"] + predicted["prefill"]


def test_each_data_plane_has_its_own_config_and_refuses_the_other_planes_keys():
    from policylab.dataplane.config import DataplaneConfig, SimPlaneConfig, TorchPlaneConfig, plane_config
    assert isinstance(DataplaneConfig(kind="sim", tensor_parallel=2), SimPlaneConfig)
    assert isinstance(DataplaneConfig(device="cpu"), TorchPlaneConfig)
    with pytest.raises(ValueError, match=r"dataplane.device is not a key of the SimPlaneConfig data plane "
                                         r"\(a key of dataplane=torch\)"):
        DataplaneConfig(kind="sim", device="cuda")
    with pytest.raises(ValueError, match=r"did you mean dataplane.time_noise"):
        DataplaneConfig(kind="sim", time_nose=0.1)
    with pytest.raises(ValueError, match="choose the plane with dataplane=sim"):
        plane_config({"_target_": "policylab.dataplane.torch_plane.TorchDataPlane", "kind": "sim"})
    torch_yaml = OmegaConf.to_container(OmegaConf.load(Path(CONFIG_DIR) / "dataplane" / "torch.yaml"))
    sim_yaml = OmegaConf.to_container(OmegaConf.load(Path(CONFIG_DIR) / "dataplane" / "sim.yaml"))["dataplane"]
    torch_yaml.pop("defaults")          # Hydra's: the torch plane's default hardware (one CPU core)
    assert plane_config(torch_yaml) == TorchPlaneConfig(step_time="auto") and plane_config(sim_yaml) == SimPlaneConfig()


def test_the_cli_keeps_dataplane_overrides_and_names_a_bad_one(tmp_path, capsys):
    from policylab.apps.cli import main
    main(["run", "policy=chunked", "trace=bursty", "dataplane=sim", "dataplane.tensor_parallel=2",
          "serving_engine=eager_nccl", "link=pcie4", "logger=none", "plots=false", "progress=false",
          f"hydra.run.dir={tmp_path}"])
    import json
    info = json.loads((tmp_path / "summary.json").read_text())["cost_model"]
    assert info["tensor_parallel"] == 2 and info["serving_engine"] == "eager_nccl"
    config = json.loads((tmp_path / "summary.json").read_text())["config"]["serving_engine"]
    assert config["collective_overhead"] == 100e-6 and not config["async_scheduling"]
    assert info["link"]["name"] == "pcie4" and info["link"]["bandwidth"] == 20e9
    with pytest.raises(SystemExit):
        main(["run", "trace=bursty", "dataplane=sim", "+dataplane.device=cuda", "logger=none", "plots=false",
              "progress=false", f"hydra.run.dir={tmp_path / 'bad'}"])
    assert "dataplane.device is not a key of the SimPlaneConfig data plane" in capsys.readouterr().err


def test_kernel_decode_attention_follows_a_published_kernel_benchmark():
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    from check_attention_kernels import errors
    err = errors()
    assert max(abs(e) for e in err["kernel"]) < 0.12          # floor + bytes: within 12 % at every point
    assert max(abs(e) for e in err["roofline"]) > 0.4         # the roofline misses the floor (what it fixes)


class TinyPlane:
    """A data plane of a user's own: a class with a Config dataclass, named by _target_."""
    from dataclasses import dataclass as _dataclass

    @_dataclass
    class Config:
        kind: str = "tiny"
        step_seconds: float = 0.01

    def __init__(self, model, hardware, config, seed):
        self.config = config


def test_a_user_plane_is_built_from_its_target_and_config():
    from policylab.dataplane import build_dataplane
    from policylab.dataplane.config import plane_config
    cfg = plane_config({"_target_": f"{__name__}.TinyPlane", "step_seconds": 0.5})
    plane = build_dataplane(cfg, LLAMA, hardware("h100"))
    assert isinstance(plane, TinyPlane) and plane.config.step_seconds == 0.5
    with pytest.raises(ValueError, match="step_sec is not a key of the Config data plane"):
        plane_config({"_target_": f"{__name__}.TinyPlane", "step_sec": 0.5})
    with pytest.raises(ValueError, match="no such importable class"):
        plane_config({"_target_": "nowhere.Plane"})
