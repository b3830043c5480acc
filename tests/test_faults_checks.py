"""Fault injection, checks: requests rejected only when they truly never fit, config values
refused before the run naming their key, trace errors naming file, line and field."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from policylab.apps.cli import CONFIG_DIR, main
from policylab.apps.run import run


def config(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=["dataplane=sim", "logger=none", "progress=false", "plots=false",
                                            *overrides])


def write_trace(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ------------------------------------------------- rejections (DESIGN §3)
@pytest.mark.parametrize("where", ["engine", "trace", "cluster"])
def test_a_request_is_rejected_only_when_prompt_plus_its_capped_output_cannot_fit(tmp_path, where):
    rows = [{"arrival_time": 0.0, "prompt_tokens": 389, "output_tokens": 16},    # 389 + 10 fits 400
            {"arrival_time": 0.1, "prompt_tokens": 395, "output_tokens": 16},    # 395 + 10 does not
            {"arrival_time": 0.2, "prompt_tokens": 20, "output_tokens": 16}]
    if where == "trace":
        rows = [{**r, "max_tokens": 10} for r in rows]
    trace = write_trace(tmp_path / "t.jsonl", rows)
    overrides = ["trace=file", f"trace.path={trace}", "engine.max_model_len=400"]
    overrides += [] if where == "trace" else ["engine.max_tokens=10"]
    overrides += ["cluster.replicas=2"] if where == "cluster" else []
    run(config(*overrides), tmp_path / "run")
    requests = pd.read_parquet(tmp_path / "run" / "requests.parquet").set_index("req_id")
    assert list(requests["status"]) == ["finished", "rejected", "finished"]
    assert requests.loc[0, "generated_tokens"] == 10
    assert "prompt (395) + output (10) tokens exceed max_model_len=400" in requests.loc[1, "reason"]


# ------------------------------------------- config refused before the run
REFUSED = {
    "top-level key": (["+foo=1"], "config: foo is not a key of the run config"),
    "efficiency > 1": (["hardware.flops_efficiency=2"], "hardware.flops_efficiency is the achieved share of the "
                                                         "peak: at most 1, got 2.0"),
    "overflowing bandwidth": (["hardware.mem_bandwidth=1e-300"], "would take inf s with hardware.peak_flops="),
    "predictor noise": (["engine.predictor=oracle", "engine.predictor_noise=1000"],
                        "engine.predictor_noise must be <= 10"),
    "objective": (["objective=nope"], "objective=nope: not a numeric summary key; one of counts.finished|"),
    "seed": (["seed=-1"], "seed must be an integer >= 0, got -1"),
    "zipf": (["trace.client_assignment=zipf", "trace.zipf_exponent=nan"], "'trace.zipf_exponent': must be a finite"),
    "block size": (["engine.block_size=100000000"], "engine.block_size=100000000 exceeds engine.max_model_len"),
    "repeat": (["trace.repeat=100000000"], "'trace.repeat': 300 requests x 100,000,000 = 30,000,000,000 requests"),
    "num_blocks": (["engine.num_blocks=1000000000000"], "engine.num_blocks=1,000,000,000,000: its accounting alone"),
    "negative SLO class": (["+trace.slo_ratio={interactive:1}", "trace.slo_classes.interactive.ttft_slo=-1"],
                           "'trace.slo_classes.interactive.ttft_slo': must be seconds, a finite number > 0; got -1"),
    "nan SLO class": (["+trace.slo_ratio={interactive:1}", "trace.slo_classes.interactive.tpot_slo=nan"],
                      "'trace.slo_classes.interactive.tpot_slo': must be seconds, a finite number > 0; got nan"),
    "text SLO class": (["+trace.slo_ratio={interactive:1}", "trace.slo_classes.interactive.tpot_slo=fast"],
                       "'trace.slo_classes.interactive.tpot_slo': must be seconds, a finite number > 0; got 'fast'"),
    "text SLO weight": (["+trace.slo_ratio={interactive:abc}"], "'trace.slo_ratio.interactive': must be a weight"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_value_that_cannot_work_is_refused_before_the_run_naming_its_key(tmp_path, capsys, case):
    overrides, message = REFUSED[case]
    with pytest.raises(SystemExit) as stop:
        main(["run", "trace=poisson", "dataplane=sim", "logger=none", "progress=false", "plots=false",
              *overrides, f"hydra.run.dir={tmp_path}"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err and "Traceback" not in err, err[-2000:]
    assert not (tmp_path / "summary.json").exists()          # refused before the replay, not after


def test_every_numeric_summary_key_is_an_objective_the_check_accepts(tmp_path):
    from policylab.analysis.metrics import flatten
    from policylab.apps.config_checks import check_objective
    summary = run(config("trace=multitenant", "trace.max_requests=40", "cluster.replicas=2"), tmp_path)
    keys = [k for k, v in flatten({k: v for k, v in summary.items() if k != "config"}).items()
            if v is None or isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert len(keys) > 50
    for key in keys:
        check_objective(key)
    with pytest.raises(ValueError, match="ttft.p42"):
        check_objective("ttft.p42")
