"""energy_aware: the SM clock lowered while every request has SLO slack, at full speed otherwise;
energy saved at the same SLO attainment; wired to the plane by the app layer, refused where no GPU
clock exists."""
from __future__ import annotations

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from policies.chunked import Chunked
from policies.energy_aware import EnergyAware
from policylab.analysis.results import write_results
from policylab.apps.cli import CONFIG_DIR
from policylab.apps.run import run
from policylab.apps.sim_check import load_group
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig, SloConfig
from policylab.core.engine import Engine
from policylab.core.request import TraceRequest
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.energy import GpuClock
from policylab.dataplane.sim import SimDataPlane
from policylab.analysis.result_files import ResultSettings

pytestmark = pytest.mark.timeout(300)

LLAMA = load_group("model", "llama3-8b", ModelConfig)
H100 = load_group("hardware", "h100", HardwareConfig)


def run_policy(tmp_path, policy, rate=8.0, n=150):
    rng = np.random.default_rng(1)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    trace = [TraceRequest(float(a), int(rng.integers(50, 1500)), int(rng.integers(10, 300))) for a in arrivals]
    plane = SimDataPlane(LLAMA, H100, DataplaneConfig(kind="sim"))
    if hasattr(policy, "attach_clock"):
        clock = GpuClock(H100)
        policy.attach_clock(clock)
        plane.attach_clock(clock)
    result = Engine(trace, policy, plane, EngineConfig(), seed=0).run()
    return write_results(tmp_path, result, ResultSettings(slo=SloConfig(ttft=0.5, tpot=0.05)), energy=plane.energy_report())


def test_with_slack_the_clock_drops_and_energy_falls_at_the_same_slo_attainment(tmp_path):
    base = run_policy(tmp_path / "chunked", Chunked())
    # slack 0.4: at 8 req/s the H100's persistent GEMMs leave every step within half of the SLOs
    policy = EnergyAware(ttft_slo=0.5, tpot_slo=0.05, slack=0.4)
    saver = run_policy(tmp_path / "energy_aware", policy)
    assert base["slo_attainment"] == saver["slo_attainment"] == 1.0
    assert 0 < policy.low_steps < policy.steps                     # both clocks used
    assert saver["energy"]["per_output_token_j"] < 0.9 * base["energy"]["per_output_token_j"]
    assert saver["tpot"]["p50"] > base["tpot"]["p50"]              # what the saving costs: slower steps


def test_without_slack_it_runs_at_full_clock_as_chunked(tmp_path):
    base = run_policy(tmp_path / "chunked", Chunked())
    policy = EnergyAware(ttft_slo=1e-6, tpot_slo=1e-6)             # short of time from the instant of arrival on
    tight = run_policy(tmp_path / "tight", policy)
    assert policy.low_steps <= 0.02 * policy.steps                 # (only a step at an idle engine's arrival instant)
    assert tight["ttft"]["p50"] == pytest.approx(base["ttft"]["p50"], rel=0.05)
    assert tight["energy"]["per_output_token_j"] == pytest.approx(base["energy"]["per_output_token_j"], rel=0.02)


def test_a_low_clock_outside_the_gpu_s_range_is_refused():
    with pytest.raises(ValueError, match=r"\[990, 1980\] MHz on h100"):
        EnergyAware(low_clock_mhz=500).attach_clock(GpuClock(H100))
    with pytest.raises(ValueError, match="slack is the share of an SLO"):
        EnergyAware(slack=0)


def config(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=["trace=multitenant", "logger=none", "progress=false", "plots=false",
                                            "trace.max_requests=60", *overrides])


def test_the_run_job_attaches_the_clock_and_reports_the_energy(tmp_path):
    summary = run(config("policy=energy_aware", "dataplane=sim"), tmp_path / "sim")
    assert summary["energy"]["gpu_clock_mhz"] in (990.0, 1980.0) and summary["energy"]["per_output_token_j"] > 0


def test_the_run_job_refuses_a_clock_policy_on_a_plane_without_a_gpu_power_model(tmp_path, capsys):
    from policylab.apps.jobs import RunError, build_engine
    from policylab.apps.config import typed_config
    with pytest.raises(RunError, match="policy energy_aware sets the GPU clock: it needs a plane timed by a GPU "
                                       "cost model"):
        build_engine(typed_config(config("policy=energy_aware")))   # the CPU plane timed as one CPU core


def test_a_clock_policy_in_a_cluster_is_refused_not_run_without_its_clock():
    from policylab.apps.config import typed_config
    from policylab.apps.jobs import RunError, build_engine
    with pytest.raises(RunError, match="sets the GPU clock .* runs on a single engine"):
        build_engine(typed_config(config("policy=energy_aware", "dataplane=sim", "cluster.replicas=2")))
