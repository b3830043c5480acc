"""`python -m policylab run dataplane=vllm`: a trace through vLLM's engine in process, written as
every run is (summary.json, requests.parquet, steps.parquet, plots)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run runs these tests)")

import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_run_on_vllm_writes_the_same_results_as_every_data_plane(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "policylab", "run", "dataplane=vllm", "policy=chunked",
                           "trace=bursty", "trace.max_requests=6", "trace.rate_scale=4", "logger=none",
                           "progress=false", f"hydra.run.dir={out}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["counts"]["finished"] == 6, summary["counts"]
    assert summary["vllm"]["version"].startswith("0.32") and summary["config"]["dataplane"]["kind"] == "vllm"
    requests = pd.read_parquet(out / "requests.parquet")
    assert (requests["generated_tokens"] == requests["output_tokens"]).all()
    assert (requests["first_token_time"] >= requests["arrival_time"]).all()
    assert (requests["finish_time"] >= requests["first_token_time"]).all()
    steps = pd.read_parquet(out / "steps.parquet")
    assert steps["prefill_tokens"].sum() == requests["prompt_tokens"].sum()      # no preemption, no hits
    assert steps["decode_tokens"].sum() == (requests["output_tokens"] - 1).sum()  # first token from prefill
    assert (steps["clock"].diff().dropna() > 0).all() and (steps["duration"] > 0).all()
    assert all((out / name).is_file() for name in ("latency_cdf.png", "timeline.png"))
