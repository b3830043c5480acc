"""Vidur-format GPU profiles as the sim's cost model (`dataplane.profile=DIR`) and the roofline
against the shared A100 Llama-3-8B profile (../shared/profiles, skipped when absent). Attention
profiles: tests/test_profile_attention.py."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from policylab.core.batch import Batch
from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.profile import LAYER_OPS, ProfileCostModel
from policylab.dataplane.profile_csv import ProfileError
from policylab.dataplane.roofline import Roofline
from policylab.dataplane.sim import SimDataPlane

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "profiles" / "vidur"
A100_LLAMA3_8B = SHARED / "compute" / "a100" / "meta-llama" / "Meta-Llama-3-8B"
needs_shared = pytest.mark.skipif(not (A100_LLAMA3_8B / "mlp.csv").is_file(),
                                  reason=f"shared profile not found at {A100_LLAMA3_8B}")


def config(group: str, name: str, cls):
    """A config group's YAML as its dataclass (PyYAML reads `312e12` as a string: made a float)."""
    data = yaml.safe_load((ROOT / "configs" / group / f"{name}.yaml").read_text())
    return cls(**{k: float(v) if isinstance(v, str) and v[:1].isdigit() else v for k, v in data.items()})


LLAMA3_8B = config("model", "llama3-8b", ModelConfig)


def measured(path: Path, tp: int = 1) -> dict:
    """num_tokens -> profile's dense time (s): layers x per-layer ops (add twice) + embedding."""
    sums: dict = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if int(row["num_tensor_parallel_workers"]) == tp:
                t = sum(float(row[f"time_stats.{op}.median"]) for op in LAYER_OPS) * 32 \
                    + float(row["time_stats.emb.median"])
                sums.setdefault(int(row["num_tokens"]), []).append(t / 1e3)
    return {n: sum(v) / len(v) for n, v in sums.items()}


@needs_shared
def test_profile_dense_time_equals_the_profile_at_every_num_tokens():
    model = ProfileCostModel(LLAMA3_8B, HardwareConfig(), DataplaneConfig(kind="sim", profile=str(A100_LLAMA3_8B)))
    truth = measured(A100_LLAMA3_8B / "mlp.csv")
    assert len(truth) > 400
    worst = max(abs(model.dense_time(n) / t - 1) for n, t in truth.items())
    assert worst < 0.01
    # between two measurements it stays between them (no overshoot), beyond the last it grows linearly
    assert truth[128] <= model.dense_time(130) <= truth[136] or truth[136] <= model.dense_time(130) <= truth[128]
    assert model.dense_time(65536) == pytest.approx(2 * model.dense_time(32768))


@needs_shared
def test_profile_drives_the_sim_and_is_described():
    dp = DataplaneConfig(kind="sim", profile=str(A100_LLAMA3_8B))
    sim = SimDataPlane(LLAMA3_8B, HardwareConfig(step_overhead=0.0), dp)
    batch = Batch([0, 1], [300, 1], [0, 700], [[0], [1]], [], [True, True], [None, None])
    dense = sim.cost_model.dense_time(301)
    assert sim.execute(batch).duration > dense
    info = sim.describe_cost_model()
    assert info["kind"] == "profile" and info["file"].endswith("mlp.csv") and len(info["sha256"]) == 64


@needs_shared
def test_tensor_parallel_uses_its_rows_and_the_all_reduce_profile():
    tp1 = ProfileCostModel(LLAMA3_8B, HardwareConfig(), DataplaneConfig(kind="sim", profile=str(A100_LLAMA3_8B)))
    dp = DataplaneConfig(kind="sim", profile=str(A100_LLAMA3_8B), tensor_parallel=2,
                         network_profile=str(SHARED / "network" / "a100_dgx"))
    tp2 = ProfileCostModel(LLAMA3_8B, HardwareConfig(), dp)
    assert tp2.all_reduce is not None and len(tp2.files) == 2
    big = 8192
    assert tp2.dense_time(big) < tp1.dense_time(big)               # half the GEMM work per GPU
    no_comm = tp2.dense_time(big) - 65 * tp2.all_reduce(big * 4096 * 2)
    assert no_comm == pytest.approx(32 * sum(tp2.ops[op](big) for op in LAYER_OPS) + tp2.ops["emb"](big))
    # without a network profile the all-reduces come from the hardware's link model
    linked = ProfileCostModel(LLAMA3_8B, HardwareConfig(), DataplaneConfig(kind="sim", profile=str(A100_LLAMA3_8B),
                                                                           tensor_parallel=2))
    size = big * 4096 * 2
    ring = HardwareConfig().collective_latency + 2 * HardwareConfig().link_latency + size / HardwareConfig().link_bandwidth
    assert linked.dense_time(big) - 65 * ring == pytest.approx(no_comm)
    with pytest.raises(ProfileError, match="num_tensor_parallel_workers=3"):
        ProfileCostModel(LLAMA3_8B, HardwareConfig(), DataplaneConfig(kind="sim", profile=str(A100_LLAMA3_8B),
                                                                      tensor_parallel=3))


@needs_shared
def test_profile_of_another_model_shape_is_refused_naming_the_mismatch():
    with pytest.raises(ProfileError, match=r"n_embd=4096 but model.hidden_size=256.*n_head=32"):
        ProfileCostModel(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim", profile=str(A100_LLAMA3_8B)))


def test_a_parallel_block_profile_counts_its_one_add_and_needs_architecture_phi(tmp_path):
    """phi-2's profile has no post_attention_layernorm column and one timed add (attention + MLP +
    residual): read as Vidur reads it, for a model that says architecture: phi."""
    ops = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "mlp_up_proj", "mlp_act",
           "mlp_down_proj", "add")
    shape = {"n_head": 32, "n_kv_head": 32, "n_embd": 2560, "n_expanded_embd": 10240, "vocab_size": 51200}
    with open(tmp_path / "mlp.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"time_stats.{op}.median" for op in ops] + list(shape) + ["use_gated_mlp", "num_tokens",
                                                                              "num_tensor_parallel_workers"])
        for n in (1, 1024):
            w.writerow([0.001 * (i + 1) * n for i in range(len(ops))] + list(shape.values()) + [False, n, 1])
    phi = ModelConfig(architecture="phi", hidden_size=2560, intermediate_size=10240, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, vocab_size=51200)
    model = ProfileCostModel(phi, HardwareConfig(), DataplaneConfig(kind="sim", profile=str(tmp_path)))
    per_layer = sum(0.001 * (i + 1) for i in range(1, len(ops)))          # every op once, the add too
    assert model.dense_time(1) == pytest.approx((32 * per_layer + 0.001) / 1e3)
    with pytest.raises(ProfileError, match="use_gated_mlp=False but model.architecture=llama"):
        ProfileCostModel(ModelConfig(**{**phi.__dict__, "architecture": "llama"}), HardwareConfig(),
                         DataplaneConfig(kind="sim", profile=str(tmp_path)))


def test_missing_file_or_column_is_named(tmp_path):
    with pytest.raises(ProfileError, match=r"mlp.csv: no such file"):
        ProfileCostModel(LLAMA3_8B, HardwareConfig(), DataplaneConfig(kind="sim", profile=str(tmp_path)))
    (tmp_path / "mlp.csv").write_text("num_tokens,time_stats.emb.median\n1,0.1\n")
    with pytest.raises(ProfileError, match=r"mlp.csv: missing column\(s\) time_stats.add.median"):
        ProfileCostModel(LLAMA3_8B, HardwareConfig(), DataplaneConfig(kind="sim", profile=str(tmp_path)))


@needs_shared
def test_default_roofline_on_the_shared_profile():
    """The A100's efficiencies and kernel latency are measured over all 8 models Vidur profiled on the
    A100 (configs/hardware/a100.yaml), not fitted to this one file; with step_overhead=0, at the
    profile's power-of-two num_tokens, decode-shaped steps (context ~0) 1-4,096 tokens and prefill
    chunks 512-16,384 are within 7.3 % here (the worst, -7.3 % at 1,024; a fit to this file alone
    meets 5 % on prefill). Between powers of two the measured kernels step with
    their GEMM tiles (up to 40 % from one 8-token point to the next), which no smooth model follows.
    The other 19 profiles: experiments/check_roofline_profiles.py and the README."""
    hw = config("hardware", "a100", HardwareConfig)
    hw.step_overhead = 0.0
    roofline, truth = Roofline(LLAMA3_8B, hw), measured(A100_LLAMA3_8B / "mlp.csv")
    error = {n: abs(roofline.dense_time(n) / truth[n] - 1) for n in (2 ** i for i in range(15))}
    assert max(e for n, e in error.items() if n <= 4096) < 0.08
    assert max(e for n, e in error.items() if 512 <= n <= 16384) < 0.08
    assert sorted(error.values())[len(error) // 2] < 0.04


def test_cost_model_choice_errors_and_the_roofline_record(tmp_path):
    with pytest.raises(ValueError, match="two cost models: set one"):
        SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim", calibration="c.json", profile="p"))
    uneven = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim", tensor_parallel=3))
    assert uneven.cost_model.shape.heads == 3          # 8 heads over 3 GPUs: the busiest holds 3
    with pytest.raises(ValueError, match="cost_model must be one of shaped, roofline, kernel"):
        SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim", cost_model="vidur"))
    info = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim")).describe_cost_model()
    assert info["kind"] == "shaped" and info["hardware"] == "h100" and info["step_overhead"] == 0.0
    info = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim", cost_model="roofline")
                        ).describe_cost_model()
    assert info["kind"] == "roofline" and info["hardware"] == "h100" and info["step_overhead"] == 0.0
