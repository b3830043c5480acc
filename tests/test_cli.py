"""The `run` job in-process: result files and summary, partial runs, one-line errors."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from policylab.apps.cli import CONFIG_DIR, main
from policylab.apps.run import run


def config(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=["trace=bursty", "dataplane=sim", "logger=none", "progress=false",
                                            "plots=false", *overrides])


def test_run_writes_the_three_result_files_and_prints_the_summary(tmp_path, capsys):
    summary = run(config("policy=prefill_first", "trace.max_requests=40"), tmp_path)
    out = capsys.readouterr().out
    assert summary["status"] == "complete" and summary["counts"]["finished"] == 40
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    assert len(requests) == 40 and set(requests["status"]) == {"finished"}
    assert len(pd.read_parquet(tmp_path / "steps.parquet")) > 0
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["ttft"]["p99"] == summary["ttft"]["p99"] and on_disk["config"]["policy"]["name"] == "prefill_first"
    for text in ("TTFT", "TPOT", "ITL", "E2E", "goodput", "SLO attainment", "throughput"):
        assert text in out


def test_run_warns_when_the_load_is_too_light_for_policies_to_differ(tmp_path, capsys):
    run(config("policy=chunked", "trace.max_requests=40"), tmp_path / "light")
    assert "warning: light load: KV peaked at" in capsys.readouterr().err
    run(config("policy=chunked", "trace.rate_scale=30", "engine.num_blocks=300"), tmp_path / "heavy")
    assert "light load" not in capsys.readouterr().err


class Exploding:
    """A policy that raises mid-run."""

    def __init__(self, name="exploding", watermark=0.01):     # (its config is prefill_first's)
        from policies.prefill_first import PrefillFirst
        self.name, self.inner = name, PrefillFirst(watermark=watermark)

    def schedule(self, view):
        if view.step == 50:
            raise RuntimeError("exploded at step 50")
        return self.inner.schedule(view)

    def on_finished(self, view):
        pass


def test_a_policy_that_raises_ends_the_run_with_partial_results(tmp_path, capsys):
    summary = run(config(f"policy._target_={__name__}.Exploding", "policy.name=exploding"), tmp_path)
    err = capsys.readouterr().err
    assert summary["status"] == "partial" and "exploded at step 50" in summary["error"]
    assert "partial results written" in err
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    assert len(requests) == 200                                        # every trace request has a row
    assert set(requests["status"]) <= {"finished", "unfinished", "rejected"}
    assert (requests["status"] == "unfinished").any() and (requests["status"] == "finished").any()


def test_a_missing_trace_file_is_one_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["run", "trace=file", "trace.path=does/not/exist.jsonl", "dataplane=sim", "logger=none",
              f"hydra.run.dir={tmp_path}"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "does/not/exist.jsonl" in err and "Traceback" not in err


def test_an_unknown_command_prints_the_usage(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["frobnicate"])
    assert stop.value.code == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err
