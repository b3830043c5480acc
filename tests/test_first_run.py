"""The default job (`python -m policylab run`): the real model computes every token, one CPU core's
cost model times the steps, so its numbers do not depend on the machine's load; measured timing
is one override away and says when the machine is loaded; the default load is one where the
shipped policies differ."""
from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from policylab.analysis.compare_findings import light_load
from policylab.apps.config import CONFIG_DIR, register, typed_config
from policylab.apps.jobs import RunError, measuring
from policylab.apps.run import run
from policylab.dataplane import build_dataplane, cpu_host
from policylab.dataplane.cpu_host import default_threads, loaded_machine, resolve_step_time

pytestmark = pytest.mark.timeout(600)
QUIET = ["logger=none", "progress=false", "plots=false"]
register()


def config(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=[*QUIET, *overrides])


def torch_plane_blocks(cfg) -> int:
    """KV blocks of the default CPU plane (what the sim needs to replay the same schedule)."""
    typed = typed_config(cfg)
    return build_dataplane(typed.dataplane, typed.model, typed.hardware).num_kv_blocks(typed.engine.block_size)


def test_the_default_job_is_the_real_plane_timed_by_one_cpu_core_at_four_times_bursty():
    run_cfg = typed_config(config())
    assert run_cfg.dataplane.kind == "torch" and run_cfg.dataplane.step_time == "auto"
    assert run_cfg.hardware.name == "cpu" and run_cfg.model.name == "tiny"
    assert run_cfg.trace.name == "bursty" and run_cfg.trace.rate_scale == 4.0
    assert typed_config(config("hardware=a100")).hardware.name == "a100"      # the command line still wins
    assert typed_config(config("dataplane=sim")).hardware.name == "h100"      # the sim's default is untouched


def test_step_time_auto_is_the_cost_model_on_cpu_and_measured_on_a_gpu():
    assert resolve_step_time("auto", "cpu") == "model" and resolve_step_time("auto", "cuda") == "measured"
    assert resolve_step_time("measured", "cpu") == "measured" and resolve_step_time("model", "cuda") == "model"
    with pytest.raises(ValueError, match="dataplane.step_time must be one of"):
        resolve_step_time("wall", "cpu")


def test_one_intra_op_thread_where_cores_are_scarce(monkeypatch):
    assert default_threads(2) == 1 and default_threads(4) == 1 and default_threads(16) is None
    import torch
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(cpu_host, "usable_cores", lambda: 2)
        torch.set_num_threads(2)
        typed = typed_config(config("dataplane.step_time=measured"))
        plane = build_dataplane(typed.dataplane, typed.model, typed.hardware)
        assert torch.get_num_threads() == 1 and plane.describe_cost_model()["threads"] == 1
        torch.set_num_threads(2)
        typed = typed_config(config("dataplane.step_time=measured", "dataplane.threads=2"))
        build_dataplane(typed.dataplane, typed.model, typed.hardware)
        assert torch.get_num_threads() == 2                                   # an explicit count is kept
    finally:
        torch.set_num_threads(before)


def test_the_loaded_machine_warning_compares_the_load_with_the_cores_left():
    assert loaded_machine(threads=1, load=0.9, cores=2) is None
    warning = loaded_machine(threads=1, load=3.2, cores=2)
    assert "load average 3.2 on 2 cores" in warning and "dataplane.step_time=model" in warning


@pytest.mark.slow
def test_a_measured_cpu_run_on_a_loaded_machine_says_so_and_a_modelled_one_does_not(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cpu_host, "usable_cores", lambda: 2)
    monkeypatch.setattr("os.getloadavg", lambda: (6.0, 6.0, 6.0))
    summary = run(config("dataplane.step_time=measured", "trace.max_requests=4"), tmp_path / "measured")
    assert summary["cost_model"]["kind"] == "real"
    assert "warning: the machine is loaded (load average" in capsys.readouterr().err
    summary = run(config("trace.max_requests=4"), tmp_path / "modelled")
    assert summary["cost_model"]["hardware"] == "cpu" and summary["cost_model"]["tokens_from"] == "real plane"
    assert "the machine is loaded" not in capsys.readouterr().err


@pytest.mark.slow
def test_the_default_replay_does_not_depend_on_the_machines_load(tmp_path):
    """The same default replay alone and beside a CPU-bound process: identical requests."""
    cfg = config("trace.max_requests=24")
    run(cfg, tmp_path / "alone")
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        run(cfg, tmp_path / "loaded")
    finally:
        burner.kill()
        burner.wait(timeout=60)
    alone, loaded = (pd.read_parquet(tmp_path / d / "requests.parquet") for d in ("alone", "loaded"))
    assert alone["finish_time"].notna().all()
    pd.testing.assert_frame_equal(alone, loaded)


def test_the_default_replay_is_the_sim_of_one_cpu_core_with_the_real_models_tokens(tmp_path):
    """Timed by the cost model, the real plane's schedule is the sim's of the same model and
    hardware (with the same KV blocks): so the full default trace's load can be checked on the sim."""
    cfg = config("trace.max_requests=30")
    run(cfg, tmp_path / "real")
    run(config("trace.max_requests=30", "dataplane=sim", "model=tiny", "hardware=cpu", "serving_engine=none",
               f"engine.num_blocks={torch_plane_blocks(cfg)}"), tmp_path / "sim")     # (the torch plane's
    # modeled step time is a CPU core's kernel time: no serving engine)
    real, sim = (pd.read_parquet(tmp_path / d / "requests.parquet") for d in ("real", "sim"))
    timing = ["arrival_time", "first_token_time", "finish_time", "ttft", "e2e", "queueing_delay", "preemptions"]
    pd.testing.assert_frame_equal(real[timing], sim[timing])


def test_at_the_default_load_policies_differ_and_the_replay_is_not_light(tmp_path):
    blocks = torch_plane_blocks(config())
    summaries = {p: run(config(f"policy={p}", "dataplane=sim", "model=tiny", "hardware=cpu", "serving_engine=none",
                               f"engine.num_blocks={blocks}"), tmp_path / p)
                 for p in ("prefill_first", "chunked")}
    for s in summaries.values():
        assert light_load(s["kv_utilization"]["max"] * 100, s["queueing_delay"]["p99"], 2.0) is None
        assert 0 < s["slo_attainment"]
    first, chunked = summaries["prefill_first"], summaries["chunked"]
    assert first["itl"]["p99"] > 3 * chunked["itl"]["p99"]          # long prefills stall prefill-first's decodes
    assert first["itl"]["p99"] > 10 * first["itl"]["p50"]


def test_calibrate_and_fidelity_measure_the_real_plane():
    assert measuring(typed_config(config()), "calibrate").dataplane.step_time == "measured"
    with pytest.raises(RunError, match="calibrate measures the real data plane"):
        measuring(typed_config(config("dataplane.step_time=model")), "calibrate")


def test_the_summary_says_what_timed_the_steps(tmp_path, capsys):
    run(config("trace.max_requests=3"), tmp_path)
    assert "step times: the cost model of hardware 'cpu'" in capsys.readouterr().out
