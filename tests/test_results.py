"""Result files: parquet round trip, strict JSON summary, atomic writes, end-of-run print."""
from __future__ import annotations

import errno
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

import policylab.analysis.result_files as result_files
from policylab.apps.config import PolicySpec, RunConfig
from policylab.core.config import SloConfig
from policylab.core.request import Status
from policylab.analysis.results import ResultsWriteError, print_summary, write_results
from policylab.apps.settings import result_settings
from tests.test_metrics import four_request_run, make_request, summary_of


def strict_json(path):
    def no_constant(name):
        raise ValueError(f"{name} in {path}")
    return json.loads(path.read_text(), parse_constant=no_constant)


def test_parquet_round_trip(tmp_path):
    write_results(tmp_path, four_request_run())
    requests = pd.read_parquet(tmp_path / "requests.parquet")
    assert list(requests["req_id"]) == [0, 1, 2, 3]
    assert list(requests["status"]) == ["finished", "finished", "rejected", "finished"]
    assert [list(t) for t in requests["token_times"]] == [[0.5, 0.7, 1.0], [2.0], [], [3.25, 4.0]]
    assert np.allclose(requests["ttft"], [0.5, 1.0, np.nan, 0.25], equal_nan=True)
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert list(steps["step"]) == list(range(6))
    assert np.allclose(steps["kv_utilization"], np.array([2, 2, 2, 1, 4, 4]) / 8)


def test_token_times_stay_float_lists_when_nothing_ran(tmp_path):
    result = four_request_run(status="partial", error="x")
    result.requests = [None] * 4
    write_results(tmp_path, result)
    schema = pq.read_schema(tmp_path / "requests.parquet")
    assert schema.field("token_times").type == pa.list_(pa.float64())
    assert list(pd.read_parquet(tmp_path / "requests.parquet")["status"]) == ["unfinished"] * 4


def test_summary_json_is_strict_and_carries_config(tmp_path):
    cfg = RunConfig(seed=3, slo=SloConfig(ttft=0.6, tpot=0.3), policy=PolicySpec(name="hand"))
    returned = write_results(tmp_path, four_request_run(), result_settings(cfg))
    summary = strict_json(tmp_path / "summary.json")      # NaN / Infinity would raise
    assert summary == returned
    assert summary["status"] == "complete" and summary["error"] == ""
    assert summary["config"]["seed"] == 3 and summary["config"]["policy"] == {"name": "hand"}
    assert summary["config"]["slo"] == {"ttft": 0.6, "tpot": 0.3}
    assert summary["slo"] == {"ttft": 0.6, "tpot": 0.3}
    # TTFT ≤ 0.6 s and TPOT ≤ 0.3 s: only request 0 (request 1's TTFT is 1 s), 2/4 with the defaults
    assert summary["slo_attainment"] == pytest.approx(1 / 4)
    assert summary["tpot"]["p50"] is not None and summary["queueing_delay"]["max"] == 0.5


def test_partial_run_is_marked(tmp_path):
    result = four_request_run(status="partial", error="interrupted (Ctrl-C)")
    result.requests[3] = None
    write_results(tmp_path, result)
    summary = strict_json(tmp_path / "summary.json")
    assert summary["status"] == "partial" and summary["partial"] is True
    assert summary["error"] == "interrupted (Ctrl-C)"
    assert pd.read_parquet(tmp_path / "requests.parquet")["status"][3] == "unfinished"


def test_full_disk_raises_clear_error_and_keeps_old_file(tmp_path, monkeypatch):
    write_results(tmp_path, four_request_run())
    before = (tmp_path / "summary.json").read_text()

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(result_files.os, "fsync", full_disk)
    with pytest.raises(ResultsWriteError, match="requests.parquet.*No space left"):
        write_results(tmp_path, four_request_run(status="partial", error="x"))
    assert (tmp_path / "summary.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["requests.parquet", "steps.parquet",
                                                           "summary.json"]


def test_print_summary_lists_rejections_and_partial_banner():
    result = four_request_run(status="partial", error="ContractViolation: boom")
    trace = result.trace[2]
    result.trace = result.trace + [trace] * 12
    result.requests = result.requests + [
        make_request(4 + i, trace, Status.REJECTED, finish=2.0, reason=f"reason {4 + i}")
        for i in range(12)]
    summary = summary_of(result)
    console = Console(record=True, width=120)
    print_summary(summary, console)
    text = console.export_text()
    assert "PARTIAL RUN: ContractViolation: boom" in text
    assert "#2 (A): too long" in text and "reason 12" in text and "reason 13" not in text
    assert "... and 3 more" in text
    assert "1,000.0" in text                         # E2E p50 of 1 s, in ms
    assert "3 finished, 13 rejected, 0 unfinished of 16" in text

