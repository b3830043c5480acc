"""Faults and bad input in the tools around a run: `capacity` on a closed-loop workload and on an
SLO no load meets, `sim-check` on CSVs as people make them, and a download cache a file was
copied into by hand (docs/faults.md)."""
from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from policylab.apps import sim_check
from policylab.apps.capacity import find_capacity
from policylab.apps.cli import main
from policylab.apps.config import CONFIG_DIR, CapacityConfig
from policylab.apps.trace_cli import main as trace_main
from policylab.datasets.catalog import TRACES
from policylab.traces.config import TraceConfig
from policylab.traces.errors import TraceError
from policylab.traces.load import load_trace


def sim_config(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=["policy=prefill_first", "dataplane=sim", "logger=none", *overrides])


# ------------------------------------------------------------------ capacity in closed loop
@pytest.mark.timeout(240)
def test_closed_loop_capacity_is_a_number_of_users(tmp_path):
    """With `trace.concurrency` the arrival times are ignored: the search is over users, the most
    that meet the target pass and one more fail, and the rate is what they were served at."""
    cfg = sim_config("trace=poisson", "trace.max_requests=50", "trace.concurrency=4", "slo.ttft=0.1")
    result = find_capacity(cfg, CapacityConfig(target=0.9), tmp_path)
    curve = pd.read_csv(tmp_path / "capacity.csv").set_index("users")
    assert result.status == "found" and result.most_users == 50 and "rate_scale" not in curve.columns
    low, high = result.interval
    assert (low, high) == (result.users, result.users + 1)
    assert curve.loc[low, "slo_attainment"] >= 0.9 > curve.loc[high, "slo_attainment"]
    assert result.rate == pytest.approx(curve.loc[low, "rate"]) and 0 < result.rate < curve.loc[50, "rate"]
    saved = json.loads((tmp_path / "capacity.json").read_text())
    assert saved["users"] == result.users and saved["rate_scale"] is None


@pytest.mark.timeout(240)
def test_capacity_of_sessions_searches_users_up_to_every_session_at_once(tmp_path, capsys):
    main(["capacity", "trace=chat_sessions", "dataplane=sim", "logger=none", f"hydra.run.dir={tmp_path}"])
    out, err = capsys.readouterr()
    assert "searching the concurrent users (trace.concurrency, 1 to 60) instead of trace.rate_scale" in err
    assert "≥ 60 concurrent users (every one of the trace's 60 sessions at once)" in out
    curve = pd.read_csv(tmp_path / "capacity.csv")
    assert list(curve["users"]) == [1, 60] and (curve["rate"] < 100).all()     # requests served, not a rate read
                                                                              # off placeholder arrival times


# ------------------------------------------------------------------ an SLO no load meets
@pytest.mark.timeout(240)
def test_an_unreachable_slo_says_so_with_the_best_attainment(tmp_path, capsys):
    main(["capacity", "trace=poisson", "dataplane=sim", "logger=none", "trace.max_requests=30", "slo.ttft=0.00001",
          "capacity.sustain=false", f"hydra.run.dir={tmp_path}"])
    out, err = capsys.readouterr()
    assert "the SLO is unreachable even at the lowest load (target 90%)" in out
    assert "best SLO attainment seen 0.0% (target 90%); a lower load cannot help" in err
    assert "lower capacity.lo" not in err
    saved = json.loads((tmp_path / "capacity.json").read_text())
    assert saved["status"] == "below_range" and saved["slo_unreachable"] and saved["best_attainment"] == 0.0


def still_rising(scale, min_span=0.0):
    """Attainment that keeps rising as the load falls: a lower bracket would find the capacity."""
    return {"rate_scale": scale, "rate": 10.0 * scale, "slo_attainment": 0.85 - scale, "goodput": 1.0,
            "ttft_p50": 0.1, "ttft_p99": 0.2, "tpot_p50": 0.01, "tpot_p99": 0.02, "preemptions": 0, "rejected": 0,
            "replay_s": 60.0, "status": "complete", "error": ""}


@pytest.mark.timeout(60)
def test_a_target_missed_while_attainment_still_rises_asks_for_a_lower_bracket(tmp_path):
    from policylab.apps.capacity import _below_range_advice
    cap = CapacityConfig(target=0.9, lo=0.5, hi=8.0, widen=2, sustain=False)
    result = find_capacity(sim_config("trace=poisson", "trace.max_requests=10"), cap, tmp_path, still_rising)
    assert result.status == "below_range"
    advice = _below_range_advice(result, cap)
    assert "best SLO attainment seen 84.8%" in advice and "lower capacity.lo (now 0.5)" in advice
    assert not json.loads((tmp_path / "capacity.json").read_text())["slo_unreachable"]


# ------------------------------------------------------------------ sim-check's CSV
HEADER = "model,gpu,tp,dtype,phase,batch,tokens_per_request,context,measured_ms\n"
ROW = "llama3-8b,h100,1,bf16,decode,8,1,1000,"
SIM_CHECK_REFUSED = {
    "nan": (HEADER + ROW + "nan\n", ":2: column 'measured_ms': expected a number > 0 ms and at most 1e+12 ms, got \"nan\""),
    "inf": (HEADER + ROW + "inf\n", ":2: column 'measured_ms': expected a number > 0 ms"),
    "1e400": (HEADER + ROW + "1e400\n", ":2: column 'measured_ms': expected a number > 0 ms"),
    "context": (HEADER + "llama3-8b,h100,1,bf16,decode,8,1,100000000000000,6\n",
                ":2: column 'context': expected an integer from 0 to 16,777,216, got \"100000000000000\""),
    "batch": (HEADER + "llama3-8b,h100,1,bf16,decode,1000000000000,1,1000,6\n",
              ":2: column 'batch': expected an integer from 1 to 65,536, got \"1000000000000\""),
    "text batch": (HEADER + "llama3-8b,h100,1,bf16,decode,eight,1,1000,6\n",
                   ":2: column 'batch': expected an integer from 1 to 65,536, got \"eight\""),
    "header only": (HEADER, ": a header and no data rows"),
    "huge cell": (HEADER + ROW + "1" * 140_000 + "\n", ":2: not a readable CSV row (field larger than field limit"),
    "unterminated quote": (HEADER + ROW + "6\n\"llama3-8b,h100,1,bf16,decode,8,1,1000,6\n" + ROW + "7\n",
                           ":3: a quote (\") opened on this line is never closed"),
    "short row": (HEADER + "llama3-8b,h100,1,bf16,decode,8\n", ":2: expected 9 cells like the header, got 6"),
    "binary": (bytes(range(256)) * 4, ":2: not UTF-8 text (byte 0x80 at column 118): expected a CSV of measurements"),
    "latin-1": ((HEADER + "llama3-8b,h100,1,bf16,décodé,8,1,1000,6\n").encode("latin-1"),
                ":2: not UTF-8 text (byte 0xe9 at column 24)"),
    "utf-16": ((HEADER + ROW + "6\n").encode("utf-16"), ":1: not UTF-8 text (byte 0xff at column 1)"),
    "missing column": ("model,gpu,tp\nllama3-8b,h100,1\n", ":1: column 'dtype': missing from the header"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(SIM_CHECK_REFUSED))
def test_sim_check_refuses_a_bad_csv_by_row_and_column(tmp_path, capsys, case):
    content, message = SIM_CHECK_REFUSED[case]
    path = tmp_path / "m.csv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert sim_check.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}{message}") and err.count("\n") == 1, err[-2000:]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["bom.csv", "m.csv.gz", "comments.csv"])
def test_sim_check_reads_a_byte_order_mark_a_gz_and_comments(tmp_path, capsys, name):
    text = HEADER + ROW + "6\n"
    path = tmp_path / name
    if name == "bom.csv":
        path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    elif name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text("# measured on one H100\n\n" + HEADER + "# warm-up dropped\n" + ROW + "6\n")
    assert sim_check.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| decode | 1 |" in out and ("(2) |" in out if name != "comments.csv" else "(5) |" in out)


# ------------------------------------------------------------------ the download cache
@pytest.mark.timeout(60)
def test_a_trace_copied_into_the_cache_by_hand_is_refused_with_the_command_that_fixes_it(tmp_path, capsys):
    """BurstGPT publishes no checksum: a file put there without the record the download writes has
    nothing to be checked against."""
    path = tmp_path / TRACES["burstgpt"].files[0].path
    path.parent.mkdir(parents=True)
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,472,18,490,Conversation log\n")
    with pytest.raises(TraceError, match=r"no checksum to verify it by .* run `python -m policylab trace download "
                                         r"burstgpt` to fetch it and record its checksum"):
        load_trace(TraceConfig(name="burstgpt", dataset="burstgpt", format="burstgpt", cache_dir=str(tmp_path)))
    assert trace_main(["list", "--cache-dir", str(tmp_path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("burstgpt "))
    assert "unverified" in line

