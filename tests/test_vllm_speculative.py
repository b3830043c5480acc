"""`dataplane=vllm` refuses draft tokens with one message: speculation declared (a drafting policy,
`speculative.k`) before vLLM starts; a plan with drafts from a policy that does not declare them
ends the run (partial, the results so far written)."""
import json

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run runs these tests)")

from vllm_cli import run_on_vllm  # noqa: E402

REFUSAL = "dataplane=vllm does not verify draft tokens"
DECLARED = "speculation and dataplane=vllm do not compose"


def test_a_plan_with_draft_tokens_is_refused_on_vllm(tmp_path):
    out = tmp_path / "run"
    proc = run_on_vllm("run", ["policy=chunked", "policy._target_=tests.vllm_policies.UndeclaredDrafts",
                                "trace=bursty", "trace.max_requests=4", "plots=false"], tmp_path, out, timeout=420)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "partial" and "spec_unsupported" in summary["error"], summary["error"]
    assert REFUSAL in summary["error"] and "Traceback" not in proc.stderr


@pytest.mark.parametrize("asked", [["policy=chunked", "speculative.k=2"], ["policy=spec_adaptive"]])
def test_declared_speculation_is_refused_before_vllm_starts(tmp_path, asked):
    proc = run_on_vllm("run", [*asked, "trace=bursty"], tmp_path, tmp_path / "k", timeout=120)
    assert proc.returncode == 2 and DECLARED in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "k" / "summary.json").exists()
