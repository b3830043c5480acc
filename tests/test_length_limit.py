"""Prompt + output beyond max_model_len: refused on arrival (`engine.length_limit=reject`), or run and
stopped at the limit as vLLM does (`stop`, what `vllm_v1` is written for unless the run says otherwise)."""
from __future__ import annotations

import json

import pytest

import policylab
from policylab.core.admission import never_fits

pytestmark = pytest.mark.timeout(120)


def test_stop_runs_a_prompt_shorter_than_the_limit_and_refuses_one_that_reaches_it():
    assert never_fits(100, 50, 128, 64, 16) == "prompt (100) + output (50) tokens exceed max_model_len=128"
    assert never_fits(100, 50, 128, 64, 16, stop_at_limit=True) == ""
    assert "no room for an output token" in never_fits(128, 5, 128, 64, 16, stop_at_limit=True)


@pytest.mark.parametrize("policy,setting,served", [("chunked", None, False), ("vllm_v1", None, True),
                                                   ("chunked", "stop", True), ("vllm_v1", "reject", False)])
def test_each_policy_runs_as_it_is_written_unless_the_run_says_otherwise(policy, setting, served, tmp_path):
    trace = tmp_path / "long.jsonl"
    trace.write_text(json.dumps({"arrival_time": 0.0, "prompt_tokens": 100, "output_tokens": 60}) + "\n" +
                     json.dumps({"arrival_time": 0.0, "prompt_tokens": 20, "output_tokens": 10}) + "\n")
    extra = [] if setting is None else [f"engine.length_limit={setting}"]
    run = policylab.replay(policy, "file", f"trace.path={trace}", "dataplane=sim", "engine.max_model_len=128",
                           "logger=none", "plots=false", "progress=false", *extra, dir=tmp_path / "run")
    rows = run.requests.set_index("req_id")
    assert rows.loc[1, "status"] == "finished" and rows.loc[1, "generated_tokens"] == 10
    if served:
        assert rows.loc[0, "status"] == "finished" and rows.loc[0, "generated_tokens"] == 28   # 100 + 28 = 128
    else:
        assert rows.loc[0, "status"] == "rejected" and "exceed max_model_len=128" in rows.loc[0, "reason"]


def test_a_bad_setting_names_its_key():
    from policylab.core.config import EngineConfig, check_engine_config
    with pytest.raises(ValueError, match="engine.length_limit must be 'reject' or 'stop'"):
        check_engine_config(EngineConfig(length_limit="truncate"))
