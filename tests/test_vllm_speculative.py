"""`dataplane=vllm` refuses draft tokens with one message: a spec-aware policy's plan ends the run
(partial, the results so far written), `speculative.k` before vLLM starts."""
import json

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run runs these tests)")

from vllm_cli import run_on_vllm  # noqa: E402

REFUSAL = "dataplane=vllm does not verify draft tokens"


def test_a_plan_with_draft_tokens_is_refused_on_vllm(tmp_path):
    out = tmp_path / "run"
    proc = run_on_vllm("run", ["policy=spec_adaptive", "trace=bursty", "trace.max_requests=4", "plots=false"],
                       tmp_path, out, timeout=420)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "partial" and "spec_unsupported" in summary["error"], summary["error"]
    assert REFUSAL in summary["error"] and "Traceback" not in proc.stderr


def test_speculative_k_is_refused_before_vllm_starts(tmp_path):
    proc = run_on_vllm("run", ["policy=chunked", "speculative.k=2", "trace=bursty"], tmp_path, tmp_path / "k",
                       timeout=120)
    assert proc.returncode != 0 and REFUSAL in proc.stderr and "Traceback" not in proc.stderr
