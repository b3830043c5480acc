"""GPU energy: the per-step power model by hand, the meter's conservation and attribution, the run's
energy metrics (summary, printout, compare), the clock knob, and determinism."""
from __future__ import annotations

import json
from pathlib import Path
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from policies.chunked import Chunked
from policylab.analysis.energy_metrics import energy_section
from policylab.analysis.metric_catalog import lookup
from policylab.analysis.results import write_results
from policylab.analysis.run_table import COLUMNS
from policylab.apps.sim_check import load_group
from policylab.core.batch import Batch
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig, SloConfig
from policylab.core.engine import Engine
from policylab.core.request import TraceRequest
from policylab.dataplane.charges import Totals
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.energy import EnergyMeter, GpuClock, PowerModel, StepWork, clocked
from policylab.dataplane.shape import ModelShape
from policylab.dataplane.sim import SimDataPlane
from policylab.analysis.result_files import ResultSettings
from tests.test_metric_catalog import numbers

pytestmark = pytest.mark.timeout(180)

LLAMA = load_group("model", "llama3-8b", ModelConfig)
H100 = load_group("hardware", "h100", HardwareConfig)


def batch(q, ctx, ids=None):
    return Batch(req_ids=ids or list(range(len(q))), query_lens=list(q), context_lens=list(ctx), sample=[True] * len(q))


def test_power_is_idle_plus_the_clocked_sms_compute_and_memory_capped_at_the_board_limit():
    pm = PowerModel(idle=70, max_power=700, active=300, compute=1000, memory=100)
    assert pm.power(0.1, 0.5) == 70 + 300 + 100 + 50
    assert pm.power(0.1, 0.5, busy=0.5) == 70 + 150 + 100 + 50            # half the step waiting on the host
    assert pm.power(0.9, 1.0) == 700                                        # capped
    half = PowerModel.of(replace(H100, clock_power_exponent=1.0), ratio=0.5)
    assert half.power(0.0, 0.0) == H100.idle_power + 0.5 * H100.active_power


def test_a_step_whose_gpu_waits_is_its_kernels_energy_plus_idle_power_for_the_wait():
    """Kernels that run G seconds of a T-second step (utilisations over T): the kernels' energy, as if
    they made a step of their own, plus idle power x (T - G); never below idle, never above the limit."""
    pm = PowerModel(idle=70, max_power=700, active=300, compute=1000, memory=100)
    for u_c, u_m in ((0.05, 0.6), (0.4, 0.3), (0.9, 0.9)):                 # the last one at the board limit
        for kernels, step in ((0.01, 0.01), (0.01, 0.03), (0.004, 0.1)):
            r = kernels / step
            assert pm.power(u_c * r, u_m * r, busy=r) * step == pytest.approx(
                pm.power(u_c, u_m) * kernels + pm.idle * (step - kernels))
    for u_c in (0.0, 0.3, 1.0):
        for u_m in (0.0, 0.5, 1.0):
            for busy in (0.0, 0.2, 1.0, 1.3):
                assert pm.idle <= pm.power(u_c, u_m, busy) <= pm.max_power
    assert pm.power(0.5, 0.5, busy=0.0) == pm.idle                        # all waiting: idle


def test_a_step_s_work_is_the_shape_s_flops_and_bytes():
    shape = ModelShape(LLAMA)
    work = StepWork(shape)
    gemm, other, memory = work.of([1] * 8, [100] * 8, 8, 8)
    params = sum(k * n for k, n in shape.gemms) * shape.layers
    assert gemm == 2 * params * 8
    pairs = 8 * 100 + 8                                                     # each decode sees its context and itself
    assert other == shape.attn_flops_per_pair * shape.layers * pairs + 2 * shape.hidden * shape.vocab * 8
    kv = shape.kv_bytes_per_token * (800 + 8)
    assert memory == pytest.approx(params * 2 + kv + shape.hidden * shape.vocab * 2 + work.token_bytes * 8)


def test_the_meter_charges_power_times_duration_and_shares_it_by_tokens():
    meter = EnergyMeter(ModelShape(LLAMA), H100, gpus=2)
    decode = batch([1] * 4, [500] * 4, ids=[0, 1, 2, 3])
    e1 = meter.step(decode, 4, 4, 0.01)
    e2 = meter.step(decode, 4, 4, 0.02)                                    # the same request list: shares pending
    mixed = batch([100, 1], [0, 600], ids=[4, 0])
    e3 = meter.step(mixed, 101, 2, 0.03)
    report = meter.report()
    assert report["busy_energy_j"] == pytest.approx(e1 + e2 + e3)
    assert report["busy_gpu_s"] == pytest.approx(0.06 * 2)
    per = report["per_request_j"]
    assert sum(per.values()) == pytest.approx(e1 + e2 + e3)                # every joule charged to a request
    assert per[1] == pytest.approx((e1 + e2) / 4)
    assert per[4] == pytest.approx(e3 * 100 / 101) and per[0] == pytest.approx((e1 + e2) / 4 + e3 / 101)
    u_m = StepWork(ModelShape(LLAMA)).of([1] * 4, [500] * 4, 4, 4)[2] / (H100.mem_bandwidth * 0.01)
    idle, active = H100.idle_power, H100.active_power
    assert idle + active < e1 / (0.01 * 2) < idle + active + H100.memory_power * u_m + 50   # + a little compute


def test_decodes_the_meter_never_charged_before_are_charged_in_full():
    """Leading decodes past the end of the charges (a decode replica's first step of requests
    prefilled elsewhere): the charges grow at the first such id and none is charged twice."""
    meter = EnergyMeter(ModelShape(LLAMA), H100, gpus=1)
    mixed = batch([1, 1, 1, 50], [300, 300, 300, 0], ids=[2, 9, 5, 30])
    mixed.decodes = 3
    e = meter.step(mixed, 53, 4, 0.02)
    per = meter.report()["per_request_j"]
    assert sorted(per) == [2, 5, 9, 30]
    assert per[2] == per[9] == per[5] == e / 53 and per[30] == e / 53 * 50


def test_energy_metrics_add_the_idle_gaps_and_divide_by_tokens_and_good_requests():
    report = {"busy_energy_j": 1000.0, "busy_time_s": 4.0, "busy_gpu_s": 8.0, "gpus": 2, "idle_power_w": 70.0,
              "max_power_w": 700.0, "gpu_clock_mhz": None, "per_request_j": Totals(np.array([600.0, 400.0]))}
    requests = pd.DataFrame({"req_id": [0, 1, 2], "status": ["finished", "finished", "rejected"],
                             "generated_tokens": [30, 20, 0], "slo_met": [True, False, False]})
    e = energy_section(report, requests, {"makespan": 5.0})
    assert e["idle_j"] == 70.0 * (2 * 5.0 - 8.0) and e["total_j"] == 1000.0 + 140.0
    assert e["per_output_token_j"] == 1140.0 / 50 and e["per_good_request_j"] == 1140.0
    assert e["per_request_j"]["mean"] == 500.0 and e["mean_power_w"] == 1140.0 / 10


def replay_energy(tmp_path, hw=H100, policy=None, **keys):
    rng = np.random.default_rng(3)
    arrivals = np.cumsum(rng.exponential(1 / 5, 60))
    trace = [TraceRequest(float(a), int(rng.integers(50, 900)), int(rng.integers(5, 200))) for a in arrivals]
    plane = SimDataPlane(LLAMA, hw, DataplaneConfig(kind="sim", **keys))
    result = Engine(trace, policy or Chunked(), plane, EngineConfig(), seed=0).run()
    return write_results(tmp_path, result, ResultSettings(slo=SloConfig(ttft=0.5, tpot=0.05)), energy=plane.energy_report())


def test_a_sim_run_reports_its_energy_declared_and_deterministic(tmp_path, capsys):
    summary = replay_energy(tmp_path / "a")
    energy = summary["energy"]
    assert energy["total_j"] == pytest.approx(energy["busy_j"] + energy["idle_j"]) and energy["idle_j"] > 0
    assert 0.01 < energy["per_output_token_j"] < 2 and H100.idle_power < energy["mean_power_w"] < H100.max_power
    for key in numbers(summary):
        lookup(key)                                                         # every energy number is declared
    assert replay_energy(tmp_path / "b")["energy"] == energy                 # same config: the same joules
    assert {"energy/token (J/token)", "energy/good request (J)"} <= {c.label for c in COLUMNS}
    from policylab.analysis.results import print_summary
    print_summary(summary)
    assert "J/out token" in capsys.readouterr().out
    on_disk = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert on_disk["energy"]["per_output_token_j"] == energy["per_output_token_j"]


def test_a_lower_clock_slows_compute_bound_prefill_not_memory_bound_decode_and_cuts_power():
    full, half = SimDataPlane(LLAMA, H100, DataplaneConfig(kind="sim")), \
        SimDataPlane(LLAMA, H100, DataplaneConfig(kind="sim", gpu_clock_mhz=990))
    prefill, decode = batch([8192], [0]), batch([1] * 16, [2000] * 16)
    assert half.step_time(prefill) > 1.8 * full.step_time(prefill)
    assert half.step_time(decode) < 1.15 * full.step_time(decode)
    e_full, e_half = full.meter.step(decode, 16, 16, full.step_time(decode)), half.meter.step(decode, 16, 16,
                                                                                              half.step_time(decode))
    assert e_half < 0.8 * e_full                                            # a memory-bound decode: less energy
    assert clocked(H100, None) is H100 and clocked(H100, 990).peak_flops == H100.peak_flops / 2


def test_the_clock_is_refused_outside_the_gpu_s_range_and_where_the_gpu_gives_none():
    with pytest.raises(ValueError, match=r"gpu_clock_mhz must be a clock in \[990, 1980\] MHz on h100"):
        SimDataPlane(LLAMA, H100, DataplaneConfig(kind="sim", gpu_clock_mhz=500))
    b200 = load_group("hardware", "b200", HardwareConfig)
    with pytest.raises(ValueError, match="hardware b200 gives no max_clock_mhz"):
        GpuClock(b200)


def test_a_gpu_without_a_power_model_reports_no_energy(tmp_path):
    cpu = load_group("hardware", "cpu", HardwareConfig)
    tiny = load_group("model", "tiny", ModelConfig)
    assert SimDataPlane(tiny, cpu, DataplaneConfig(kind="sim")).energy_report() is None


def test_bad_power_constants_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="hardware.max_power .* must exceed hardware.idle_power"):
        SimDataPlane(LLAMA, replace(H100, max_power=50.0), DataplaneConfig(kind="sim"))
    with pytest.raises(ValueError, match="hardware.active_power must be a finite number >= 0"):
        SimDataPlane(LLAMA, replace(H100, active_power=float("nan")), DataplaneConfig(kind="sim"))


def test_energy_metrics_reach_wandb(tmp_path):
    from policylab.analysis.tracking import RUN_INFO_FILE, open_tracker
    from policylab.apps.settings import tracker_settings
    from tests.test_tracking import logged, run_cfg
    summary = replay_energy(tmp_path / "run")
    tracker = open_tracker(tracker_settings(run_cfg({})), tmp_path / "run")
    tracker.log_run(tmp_path / "run", summary)
    tracker.finish()
    (wandb_file,) = Path(json.loads((tmp_path / "run" / RUN_INFO_FILE).read_text())["dir"]).glob("run-*.wandb")
    log = logged(wandb_file)["summary"]
    for key in ("per_output_token_j", "per_good_request_j", "total_j", "mean_power_w"):
        assert log[f"energy/{key}"] == pytest.approx(summary["energy"][key]), key
    assert log["energy/per_request_j/p99"] == pytest.approx(summary["energy"]["per_request_j"]["p99"])


def test_compare_shows_the_joules_of_each_configuration(tmp_path):
    from policylab.analysis.compare import main as compare_main
    for name, keys in (("0_bf16", {}), ("1_fp8", dict(weight_dtype="fp8", compute_dtype="fp8"))):
        run_dir = tmp_path / "sweep" / name
        replay_energy(run_dir, **keys)
        (run_dir / ".hydra").mkdir()
        (run_dir / ".hydra" / "overrides.yaml").write_text(f"- quant={name[2:]}\n")
    assert compare_main([str(tmp_path / "sweep"), "-o", str(tmp_path / "cmp")]) == 0
    table = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    column = "energy/token (J/token)"
    assert column in table.columns
    bf16, fp8 = (table.loc[table["label"].str.contains(q), column].item() for q in ("bf16", "fp8"))
    assert fp8 < bf16                                            # FP8 weights stream half the bytes: fewer joules


def test_throttling_at_the_board_limit_slows_a_compute_bound_step_until_it_fits():
    capped = SimDataPlane(LLAMA, H100, DataplaneConfig(kind="sim"))
    throttled = SimDataPlane(LLAMA, H100, DataplaneConfig(kind="sim", power_limit="throttle"))
    prefill = batch([8192], [0])
    t_cap = capped.step_time(prefill)
    assert capped.meter.demand(prefill, 8192, 1, t_cap, 1.0)[0] > H100.max_power       # over the TDP at full clock
    t_thr = throttled.step_time(prefill)
    assert t_thr > t_cap and throttled.meter.report()["throttled_time_s"] == t_thr
    power = throttled.meter.report()["busy_energy_j"] / t_thr
    assert power <= H100.max_power + 1e-9
    decode = batch([1] * 8, [500] * 8)                            # far below the limit: untouched
    assert throttled.step_time(decode) == capped.step_time(decode)
    with pytest.raises(ValueError, match="dataplane.power_limit must be one of cap, throttle"):
        SimDataPlane(LLAMA, H100, DataplaneConfig(kind="sim", power_limit="melt"))
    with pytest.raises(ValueError, match="power_limit=throttle lowers the SM clock: hardware b200"):
        SimDataPlane(LLAMA, load_group("hardware", "b200", HardwareConfig),
                     DataplaneConfig(kind="sim", power_limit="throttle"))
