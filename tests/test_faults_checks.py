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
