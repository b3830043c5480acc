"""Tool calls on the real data plane (keep, free and offload give the same greedy tokens) and from the
command line (sim and torch planes; the vLLM plane refuses them in one line)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from policies.chunked import Chunked
from policylab.core.config import EngineConfig
from policylab.core.request import TraceRequest
from policylab.core.extensions.tool_calls import ToolCall

pytestmark = pytest.mark.timeout(300)

COMMON = ["logger=none", "plots=false", "progress=false"]


def test_torch_plane_keep_free_and_offload_give_identical_greedy_tokens():
    pytest.importorskip("torch")
    from policylab.core.engine import Engine
    from policylab.dataplane.torch_plane import TorchDataPlane
    from tests.test_dataplane_model import SMALL, dataplane

    trace = [TraceRequest(0.0, 20, 12, tool_calls=(ToolCall(3, 0.01, 5), ToolCall(7, 0.02, 6))),
             TraceRequest(0.0, 14, 10, tool_calls=(ToolCall(4, 0.005, 9),)),
             TraceRequest(0.001, 9, 8)]
    outputs, stats = {}, {}
    for mode in ("keep", "free", "offload"):
        cfg = EngineConfig(block_size=4, num_blocks=40, max_num_batched_tokens=32, max_num_seqs=4,
                           max_model_len=256, check_invariants=True, host_kv_blocks=32, tool_kv=mode)
        plane = TorchDataPlane.from_config(dataplane(), SMALL, seed=0)
        result = Engine(trace, Chunked(chunk_size=32), plane, cfg, seed=0).run()
        assert result.status == "complete", result.error
        outputs[mode], stats[mode] = [list(r.output_ids) for r in result.requests], result.sections.get("tool_calls").stats
    assert outputs["keep"] == outputs["free"] == outputs["offload"]
    assert stats["keep"]["kept"] == stats["free"]["freed"] == stats["offload"]["offloaded"] == 3
    assert stats["free"]["recomputed_tokens"] > 0 == stats["keep"]["recomputed_tokens"]
    for t, out in zip(trace, outputs["keep"]):
        assert len(out) == t.output_tokens + t.tool_tokens


def _run(main, tmp_path, *overrides) -> dict:
    main(["run", *COMMON, f"hydra.run.dir={tmp_path}", *overrides])
    return json.loads((tmp_path / "summary.json").read_text())


def test_cli_sim_replays_the_shipped_tool_agent_trace(tmp_path):
    from policylab.apps.cli import main
    kept = _run(main, tmp_path / "keep", "trace=toolagent", "dataplane=sim", "policy=plas", "engine.tool_kv=keep")
    free = _run(main, tmp_path / "free", "trace=toolagent", "dataplane=sim", "policy=plas", "engine.tool_kv=free",
                "engine.num_blocks=200")
    for s in (kept, free):
        assert s["counts"]["finished"] == s["counts"]["requests"] == 40
        assert s["programs"]["tool_calls"] > 0 and s["programs"]["jct"]["p50"] > s["e2e"]["p50"]
    assert kept["programs"]["kept"] == kept["programs"]["tool_calls"] and kept["programs"]["recomputed_tokens"] == 0
    assert free["programs"]["freed"] == free["programs"]["tool_calls"] and free["programs"]["recomputed_tokens"] > 0
    requests = pd.read_parquet(tmp_path / "free" / "requests.parquet")
    assert {"jct", "tool_time", "tool_calls", "recomputed_tokens"} <= set(requests.columns)
    assert "tool_gaps" not in requests.columns
    from policylab.analysis.run_table import collect_runs
    table, _ = collect_runs([tmp_path / "keep", tmp_path / "free"])
    assert set(table["tool recomputed tokens"]) == {0, free["programs"]["recomputed_tokens"]}


def test_cli_adds_tool_calls_to_any_trace(tmp_path):
    from policylab.apps.cli import main
    s = _run(main, tmp_path, "trace=poisson", "trace.max_requests=30", "dataplane=sim",
             "+trace.tool_calls={calls: 2, duration_s: 0.5, result_tokens: 32}")
    assert s["programs"]["programs_with_calls"] == 30 and s["programs"]["tool_calls"] == 60


@pytest.mark.slow
def test_cli_torch_plane_runs_tool_calls(tmp_path):
    pytest.importorskip("torch")
    from policylab.apps.cli import main
    s = _run(main, tmp_path, "trace=toolagent", "trace.max_requests=3", "trace.max_prompt_tokens=32",
             "trace.max_output_tokens=60", "dataplane=torch", "model=tiny", "engine.tool_kv=offload",
             "engine.host_kv_blocks=64")
    assert s["counts"]["finished"] == 3 and s["programs"]["offloaded"] == s["programs"]["tool_calls"] > 0


def test_vllm_plane_refuses_tool_calls_in_one_line(tmp_path, capsys):
    from policylab.apps.cli import main
    with pytest.raises(SystemExit) as stop:
        main(["run", *COMMON, f"hydra.run.dir={tmp_path}", "trace=toolagent", "dataplane=vllm"])
    assert stop.value.code != 0
    err = capsys.readouterr().err
    assert "tool_calls and dataplane=vllm do not compose" in err and "Traceback" not in err


def test_a_bad_tool_kv_setting_is_one_clear_error(tmp_path, capsys):
    from policylab.apps.cli import main
    with pytest.raises(SystemExit):
        main(["run", *COMMON, f"hydra.run.dir={tmp_path}", "trace=toolagent", "dataplane=sim",
              "engine.tool_kv=discard"])
    err = capsys.readouterr().err
    assert "engine.tool_kv must be one of" in err and "Traceback" not in err


def test_replicas_serve_tool_calls_and_pd_refuses_them_in_one_line(tmp_path, capsys):
    """On colocated replicas a request pauses and resumes on its own replica (the tools return on
    the cluster's one queue) and the summary counts every replica's calls; under P/D refused."""
    from policylab.apps.cli import main
    main(["run", *COMMON, f"hydra.run.dir={tmp_path / 'run'}", "trace=toolagent", "dataplane=sim",
          "cluster.replicas=2", "trace.max_requests=30"])
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "complete" and s["programs"]["tool_calls"] > 0 and s["programs"]["jct"]["mean"] > 0
    with pytest.raises(SystemExit):
        main(["run", *COMMON, f"hydra.run.dir={tmp_path / 'pd'}", "trace=toolagent", "dataplane=sim",
              "cluster.prefill_replicas=1", "cluster.decode_replicas=1"])
    err = capsys.readouterr().err
    assert "tool_calls and P/D disaggregation" in err and "Traceback" not in err


def test_python_api_composes_a_tool_call_run_in_process(tmp_path):
    import policylab
    run = policylab.replay("plas", "toolagent", dir=tmp_path, dataplane="sim", logger="none", plots="false",
                           progress="false", engine={"tool_kv": "offload", "host_kv_blocks": 4000})
    assert run.status == "complete"
    p = run.summary["programs"]
    assert p["offloaded"] == p["tool_calls"] > 0 and p["recomputed_tokens"] == 0
    assert (run.requests["jct"] >= run.requests["e2e"]).all()
