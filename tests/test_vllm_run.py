"""`python -m policylab run dataplane=vllm`: a trace through vLLM's engine in process, written as
every run is (summary.json, requests.parquet, steps.parquet, plots)."""
import json

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run runs these tests)")

import pandas as pd  # noqa: E402
from vllm_cli import run_on_vllm  # noqa: E402


def test_run_on_vllm_writes_the_same_results_as_every_data_plane(tmp_path):
    out = tmp_path / "run"
    proc = run_on_vllm("run", ["policy=chunked", "trace=bursty", "trace.max_requests=6", "trace.rate_scale=4"],
                       tmp_path, out, timeout=420)
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
