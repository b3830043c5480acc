"""`python -m policylab fidelity dataplane=vllm`: the simulator fitted on vLLM's steps and compared
with two vLLM replays of the same trace."""
import json

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run runs these tests)")

import pandas as pd  # noqa: E402
from vllm_cli import run_on_vllm  # noqa: E402


def test_fidelity_against_vllm_reports_error_next_to_vllms_own_spread(tmp_path):
    out = tmp_path / "fid"
    proc = run_on_vllm("fidelity", ["policy=chunked", "trace=bursty", "trace.max_requests=8", "trace.rate_scale=4",
                                    "plots=false"], tmp_path, out, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    calibration = json.loads((out / "calibration.json").read_text())
    assert calibration["measured_on"]["kind"] == "vllm" and calibration["n_train"] > 0
    assert len(pd.read_csv(out / "profile.csv")) >= 8          # one row per vLLM step (8 prefills at least)
    table = pd.read_csv(out / "fidelity.csv")
    headline = table[table["metric"].isin(["ttft p50", "tpot p50", "e2e mean"])]
    assert headline[["real", "sim", "real_again"]].gt(0).all().all()
    assert headline["rel_error"].notna().all() and headline["real_noise"].notna().all()
    real = json.loads((out / "real" / "summary.json").read_text())
    sim = json.loads((out / "sim" / "summary.json").read_text())
    assert real["counts"]["finished"] == sim["counts"]["finished"] == 8
    assert "Sim vs vLLM" in (out / "fidelity.md").read_text()
