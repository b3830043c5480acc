"""Calibrate the sim on the real (tiny) data plane, then replay one trace on both: end to end."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from policylab.apps.cli import CONFIG_DIR
from policylab.apps.fidelity import fidelity

SMALL_MODEL = ["model.hidden_size=64", "model.intermediate_size=128", "model.num_hidden_layers=2",
               "model.num_attention_heads=4", "model.num_key_value_heads=2", "model.vocab_size=512"]


@pytest.mark.slow
def test_calibration_and_fidelity_report_end_to_end(tmp_path):
    cfg_overrides = [
        "policy=chunked", "policy.chunk_size=128", "trace=bursty", "trace.max_requests=12",
        "trace.max_prompt_tokens=200", "trace.max_output_tokens=8", "engine.max_num_batched_tokens=128",
        "engine.max_num_seqs=8", "engine.max_model_len=1024", "dataplane.kv_cache_gb=0.01",
        "dataplane.threads=1", "dataplane.timer=cpu", "logger=none", "progress=false", *SMALL_MODEL]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=cfg_overrides)
    table = fidelity(cfg, tmp_path)
    calibration = json.loads((tmp_path / "calibration.json").read_text())
    profile = pd.read_csv(tmp_path / "profile.csv")
    assert len(profile) >= 10 and (profile["time"] > 0).all()
    assert all(w >= 0 for w in calibration["weights"]) and calibration["weights"][0] > 0   # overhead
    # measured steps: how well they fit depends on the machine's noise, so only that an error was
    # measured; the fit's accuracy is asserted on synthetic profiles (tests/test_calibrate.py)
    assert math.isfinite(calibration["heldout_mape"]) and calibration["heldout_mape"] >= 0
    assert set(table["metric"]) >= {"ttft p50", "ttft p99", "tpot p50", "tpot p99", "makespan"}
    assert (table["real"] > 0).all() and (table["sim"] > 0).all()
    assert table["rel_error"].notna().all() and table["real_noise"].notna().all()
    assert (table["real_again"] > 0).all()
    report = (tmp_path / "fidelity.md").read_text()
    assert report.startswith("# Sim vs real") and "real run-to-run spread: at most" in report
    assert calibration["measured_on"]["timer"] == "cpu"
    kinds = {d: json.loads((tmp_path / d / "summary.json").read_text())["cost_model"]["kind"]
             for d in ("real", "real_again", "sim")}
    assert kinds == {"real": "real", "real_again": "real", "sim": "fit"}

    # the same comparison from those two real replays, without running them again
    real_runs = f"fidelity.real_runs=[{tmp_path / 'real'},{tmp_path / 'real_again'}]"
    calibration_file = f"dataplane.calibration={tmp_path / 'calibration.json'}"
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        again = fidelity(compose("config", overrides=[*cfg_overrides, real_runs, calibration_file]), tmp_path / "b")
        pd.testing.assert_frame_equal(again, table)
        other = compose("config", overrides=[*cfg_overrides, real_runs, calibration_file, "seed=1"])
    with pytest.raises(ValueError, match="real_runs: .*real has seed=0, this config 1"):
        fidelity(other, tmp_path / "c")
    assert (tmp_path / "fidelity_cdf.png").stat().st_size > 10_000


def test_calibration_adds_every_step_of_a_replay(tmp_path):
    from policylab.apps.calibrate import calibrate
    from policylab.apps.jobs import build_engine, dataplane_of
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[
            "policy=prefill_first", "trace=poisson", "trace.max_requests=6", "trace.max_prompt_tokens=64",
            "trace.max_output_tokens=4", "engine.max_num_batched_tokens=64", "engine.max_num_seqs=4",
            "engine.max_model_len=256", "dataplane.kv_cache_gb=0.005", "dataplane.threads=1", *SMALL_MODEL])
    plane = dataplane_of(cfg)
    engine = build_engine(cfg, plane)
    calibrate(plane, cfg.engine, tmp_path, replay_engine=engine)
    profile = pd.read_csv(tmp_path / "profile.csv")
    steps = len(engine.steps["clock"])
    assert steps > 0 and len(profile) > steps
    assert (profile["time"].tail(steps).to_numpy() == engine.steps["duration"]).all()
    assert type(plane).execute is plane.execute.__func__       # the recording wrapper is gone
