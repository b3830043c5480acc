"""Closed-loop runs from the command line: a session trace on the sim and on the torch plane (tiny
model: a turn's prompt holds the tokens the model really generated before it), `trace.concurrency`
on any trace and on a cluster, the session figures in summary.json, requests.parquet, the printout
and compare, and dataplane=vllm refusing closed loops with one message."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from policylab.analysis.compare import main as compare
from policylab.apps.cli import CONFIG_DIR
from policylab.apps.jobs import RunError
from policylab.apps.run import run
from policylab.traces.session_generate import SessionSpec, generate_sessions
from policylab.traces.sessions import write_sessions

pytestmark = pytest.mark.timeout(300)


def config(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=["dataplane=sim", "logger=none", "progress=false", "plots=false",
                                            *overrides])


@pytest.fixture
def session_file(tmp_path):
    spec = SessionSpec(mean_turns=3.0, think_time=0.2)
    path = tmp_path / "chat.jsonl"
    write_sessions(path, generate_sessions(spec, 12, seed=2))
    return path


def test_a_session_trace_runs_in_closed_loop_with_session_figures(tmp_path, session_file, capsys):
    summary = run(config("trace=file", f"trace.path={session_file}"), tmp_path / "run")
    sessions = summary["sessions"]
    assert summary["status"] == "complete" and sessions["count"] == 12 == sessions["completed"]
    assert sessions["completion_time"]["p50"] > 0 and "0" in sessions["ttft_by_turn"]
    assert summary["prefix_cache_hit_rate"] > 0.3              # later turns hit their conversation
    out = capsys.readouterr().out.replace("\n", " ")
    assert "12 of 12 completed" in " ".join(out.split())
    requests = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert {"session", "turn"} <= set(requests.columns) and requests["turn"].max() >= 1
    first = requests[requests["turn"] == 0].set_index("session")["arrival_time"]
    last = requests.groupby("session")["finish_time"].max()
    assert (last - first).max() == pytest.approx(sessions["completion_time"]["max"])


def test_concurrency_on_a_cluster_and_compare_shows_session_time(tmp_path):
    for users in (2, 8):
        summary = run(config("trace=poisson", "trace.max_requests=40", f"trace.concurrency={users}",
                             "cluster.replicas=2", "router=least_loaded"), tmp_path / f"u{users}")
        assert summary["sessions"]["users"] == users and summary["counts"]["finished"] == 40
        assert "arrival times are ignored" in summary["sessions"]["mode"]
    assert compare([str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "compare" / "compare.csv")
    assert table["session time p99 (s)"].notna().all()


def test_the_torch_plane_runs_sessions_on_the_model_s_own_tokens(tmp_path):
    path = tmp_path / "small.jsonl"
    write_sessions(path, generate_sessions(SessionSpec(mean_turns=2.0, max_turns=3, think_time=0.05), 3, seed=1))
    summary = run(config("dataplane=torch", "model=tiny", "trace=file", f"trace.path={path}",
                         "trace.max_output_tokens=6", "trace.max_prompt_tokens=64"), tmp_path / "torch")
    assert summary["status"] == "complete" and summary["sessions"]["completed"] == 3
    requests = pd.read_parquet(tmp_path / "torch" / "requests.parquet")
    assert (requests["status"] == "finished").all() and requests["cached_tokens"].sum() > 0


def test_vllm_refuses_closed_loops_with_one_message(session_file):
    from policylab.apps.config import typed_config
    from policylab.apps.run_vllm import vllm_setup
    cfg = typed_config(config("trace=poisson", "trace.concurrency=2"))
    with pytest.raises(RunError, match="sessions and dataplane=vllm do not compose"):
        vllm_setup(cfg)
