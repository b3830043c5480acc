"""The B200 in the sim against its datasheet limits, and the ML.ENERGY testbed's host time
(configs/host/mlenergy_v3.yaml): per-request host work that a faster GPU does not shrink, so large
decode batches run no faster on a B200 than on an H100, as the benchmark measured."""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from policylab.apps.config import CONFIG_DIR
from policylab.apps.sim_check import load_group
from policylab.core.batch import Batch
from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.serving_engine import ServingEngineConfig
from policylab.dataplane.shape import ModelShape
from policylab.dataplane.sim import SimDataPlane

pytestmark = pytest.mark.timeout(60)

LLAMA = load_group("model", "llama3-8b", ModelConfig)
B200, H100 = (load_group("hardware", g, HardwareConfig) for g in ("b200", "h100"))
VLLM = load_group("serving_engine", "vllm", ServingEngineConfig)
HOST_FILE = Path(CONFIG_DIR) / "host" / "mlenergy_v3.yaml"
HOST = OmegaConf.to_container(OmegaConf.load(HOST_FILE))


def plane(hw: HardwareConfig, on_testbed: bool = False) -> SimDataPlane:
    if on_testbed:
        hw = replace(hw, host=HOST["host"], step_overhead=HOST["step_overhead"],
                     host_per_request=HOST["host_per_request"], host_per_token=HOST["host_per_token"])
    return SimDataPlane(LLAMA, hw, DataplaneConfig(kind="sim", serving_engine=VLLM))


def decode(n: int, context: int = 500) -> Batch:
    return Batch(req_ids=list(range(n)), query_lens=[1] * n, context_lens=[context] * n, sample=[True] * n)


def test_a_b200_step_is_no_faster_than_its_bandwidth_and_compute_allow():
    shape, b200, h100 = ModelShape(LLAMA), plane(B200), plane(H100)
    weights = sum(k * n for k, n in shape.gemms) * shape.layers * shape.dtype_bytes
    for n in (8, 64, 512):
        kv = shape.kv_bytes_per_token * n * 501
        t = b200.step_time(decode(n))
        assert t >= (weights + kv) / B200.mem_bandwidth
        # no faster than its bandwidth advantage over the H100 allows (decode streams weights and KV)
        assert t >= h100.step_time(decode(n)) * H100.mem_bandwidth / B200.mem_bandwidth
    prefill = Batch(req_ids=[0], query_lens=[8192], context_lens=[0], sample=[True])
    assert b200.step_time(prefill) >= 2 * sum(k * n for k, n in shape.gemms) * shape.layers * 8192 / B200.peak_flops


def host_floor(n: int) -> float:
    return HOST["step_overhead"] + VLLM.host_per_step + (HOST["host_per_request"] + VLLM.host_per_request) * n


def test_the_testbed_host_binds_large_decode_batches_alike_on_both_gpus_and_hides_behind_longer_gpu_steps():
    b200, h100, b200_host, h100_host = plane(B200), plane(H100), plane(B200, True), plane(H100, True)
    large = decode(1024)
    assert b200_host.step_time(large) >= host_floor(1024) and h100_host.step_time(large) >= host_floor(1024)
    assert b200.step_time(large) < 0.7 * h100.step_time(large)             # the GPUs alone: the B200 far faster
    assert b200_host.step_time(large) > 0.9 * h100_host.step_time(large)   # on the testbed's host: about the same
    small = decode(8)                   # async scheduling: the longer of the GPU's and the host's (+ one graph launch)
    assert b200_host.step_time(small) == pytest.approx(max(b200.step_time(small), host_floor(8) + VLLM.kernel_launch))
    assert h100.step_time(small) > host_floor(8) and h100_host.step_time(small) == h100.step_time(small)


def test_the_testbed_host_and_the_b200_power_constants_load_and_are_cited():
    text = HOST_FILE.read_text()
    comments = " ".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    assert "ML.ENERGY" in comments and "held out" in comments
    for key in ("step_overhead", "host_per_request"):
        assert HOST[key] > 0 and key in comments
    b200 = (Path(CONFIG_DIR) / "hardware" / "b200.yaml").read_text()
    b200_comments = " ".join(line for line in b200.splitlines() if line.lstrip().startswith("#"))
    for key in ("idle_power", "max_power", "active_power", "compute_power", "memory_power", "bw_efficiency",
                "gemm_efficiency", "kernel_latency"):
        assert re.search(rf"\b{key}\b", b200_comments), f"b200.yaml: {key} has no source in a comment"
        assert getattr(B200, key) > 0
    # the power constants: the datasheet's board limit, a public idle reading, the fit pair named and the rest held out
    energy = b200_comments[b200_comments.index("Energy:"):]
    assert "datasheet" in energy.split("idle_power")[0] and f"{B200.max_power:,.0f} W" in energy
    assert re.search(r"idle_power \d+ W: .*(github\.com|ASSUMED)", energy)
    assert "FITTED" in energy and "held out" in energy
    assert B200.idle_power < B200.active_power + B200.idle_power <= B200.max_power


def long_decode(n: int) -> Batch:
    return decode(n, context=1000)


def test_a_host_bound_step_draws_idle_power_while_its_gpu_waits():
    """The same kernels in a step the host stretches: the extra seconds cost idle power and nothing else."""
    for hw in (B200, H100):
        gpu_bound, host_bound = plane(hw), plane(hw, True)
        batch = long_decode(1024)
        t_gpu = gpu_bound.step_time(batch)
        assert gpu_bound.cost_model.kernel_share == 1.0          # (precondition: the kernels fill this step)
        e_gpu = gpu_bound.meter.busy_j
        t_host = host_bound.step_time(batch)
        share = host_bound.cost_model.kernel_share
        assert t_host > 1.2 * t_gpu and share == pytest.approx(t_gpu / t_host)
        e_host = host_bound.meter.busy_j
        assert e_host - e_gpu == pytest.approx(hw.idle_power * (t_host - t_gpu), rel=1e-9)
        # so its mean power falls towards idle as the host stretches it, and stays above idle
        assert hw.idle_power < e_host / t_host < e_gpu / t_gpu


def test_every_step_s_energy_lies_between_idle_and_the_board_limit_times_its_duration():
    batches = [decode(n, c) for n in (1, 8, 256, 2048) for c in (10, 4000)]
    batches += [Batch(req_ids=[0, 1], query_lens=[8192, 1], context_lens=[0, 300], sample=[True, True])]
    for hw in (B200, H100):
        for p in (plane(hw), plane(hw, True)):
            for b in batches:
                before = p.meter.busy_j
                t = p.step_time(b)
                energy = p.meter.busy_j - before
                assert hw.idle_power * t * (1 - 1e-12) <= energy <= hw.max_power * t * (1 + 1e-12)
