"""Fault injection, trace files: every malformed input ends in one line naming the file, the line
and the field, never a traceback; compressed bombs are refused without reading them whole."""
from __future__ import annotations

import gzip
import json
import os

import pytest

import policylab.traces.fields as fields
from policylab.apps.cli import main
from policylab.apps.trace_cli import main as trace_main
from policylab.traces import TraceConfig, TraceError, load_trace

GOOD = '{"arrival_time": 0, "prompt_tokens": 5, "output_tokens": 5}\n'
VIDUR = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,10,5\n"


def load(path, **kw):
    return load_trace(TraceConfig(path=str(path), **kw))


NATIVE_CASES = {
    "deep nesting": ('{"arrival_time": 1, "prompt_tokens": 5, "output_tokens": 5, "x": ' + "[" * 100_000
                     + "]" * 100_000 + "}\n", "t.jsonl:2: JSON nested too deeply"),
    "400-digit arrival": ('{"arrival_time": 1' + "0" * 400 + ', "prompt_tokens": 5, "output_tokens": 5}\n',
                          "t.jsonl:2: field 'arrival_time': expected a finite number of seconds >= 0"),
    "400-digit SLO": ('{"arrival_time": 1, "prompt_tokens": 5, "output_tokens": 5, "ttft_slo": 1' + "0" * 400 + "}\n",
                      "t.jsonl:2: field 'ttft_slo': expected a positive number of seconds"),
    "past the digit limit": ('{"arrival_time": 1, "prompt_tokens": 1' + "0" * 5000 + ', "output_tokens": 5}\n',
                             "t.jsonl:2: not a readable JSON record (Exceeds the limit"),
}


@pytest.mark.parametrize("case", sorted(NATIVE_CASES))
def test_a_malformed_native_line_names_file_line_and_field(tmp_path, case):
    line, message = NATIVE_CASES[case]
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD + line)
    with pytest.raises(TraceError) as error:
        load(path)
    assert str(error.value).startswith(str(path)) and message.split("t.jsonl", 1)[1] in str(error.value)


def test_trace_inspect_says_the_same_in_one_line(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text(GOOD + NATIVE_CASES["deep nesting"][0])
    assert trace_main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}:2: JSON nested too deeply" in err


@pytest.mark.parametrize("cell, message", [
    ("1" * 200_000, ":3: not a readable CSV row (field larger than field limit"),
    ("-1e308", ":3: column 'arrived_at': expected a finite number of seconds >= 0"),
    ("1e308", ":3: column 'arrived_at': expected a finite number of seconds >= 0 (at most 1e+15), got 1e+308"),
])
def test_a_malformed_csv_cell_names_the_line(tmp_path, cell, message):
    path = tmp_path / "t.csv"
    path.write_text(VIDUR + f"{cell},10,5\n")
    with pytest.raises(TraceError) as error:
        load(path)
    assert str(error.value).startswith(f"{path}{message}"), error.value


def test_a_utf8_byte_order_mark_is_accepted(tmp_path):
    for name, text in (("t.jsonl", GOOD), ("t.csv", VIDUR)):
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert [(r.prompt_tokens, r.output_tokens) for r in load(path)] in ([(5, 5)], [(10, 5)])


def test_a_directory_or_a_fifo_is_not_a_missing_file(tmp_path):
    with pytest.raises(TraceError, match="is a directory: give a trace file"):
        load(tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(TraceError, match=r"is not a regular file \(a FIFO"):
        load(fifo)


# ------------------------------------------------------------------ gzip bombs
def test_a_gzip_that_expands_to_one_huge_line_is_refused_at_its_bound(tmp_path):
    path = tmp_path / "bomb.jsonl.gz"
    path.write_bytes(gzip.compress(GOOD.encode() + b"x" * (fields.MAX_LINE_CHARS + 10)))
    with pytest.raises(TraceError, match=r"bomb.jsonl.gz:2: a line longer than 16,777,216 characters"):
        load(path)


def test_a_gzip_of_blank_lines_is_refused_quickly(tmp_path):
    path = tmp_path / "blank.jsonl.gz"
    path.write_bytes(gzip.compress(GOOD.encode() + b"\n" * (fields.MAX_BLANK_LINES + 10)))
    with pytest.raises(TraceError, match=r"more than 1,000,000 blank lines: not a trace"):
        load(path)


def test_a_gzip_that_expands_far_beyond_any_trace_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(fields, "GZIP_ALLOWANCE", 1 << 20)     # (the same bound, at a test's size)
    path = tmp_path / "many.jsonl.gz"
    path.write_bytes(gzip.compress(GOOD.encode() * 100_000, compresslevel=9))
    assert path.stat().st_size * fields.GZIP_MAX_RATIO < len(GOOD) * 100_000
    with pytest.raises(TraceError, match=r"many.jsonl.gz:\d+: expands to more than [\d,]+ characters from [\d,]+ compressed bytes \(200x\)"):
        load(path)


# --------------------------------------------------------------- in a sweep
def test_in_a_sweep_a_bad_trace_fails_its_job_and_the_report_still_prints(tmp_path, capsys):
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text(GOOD * 3)
    bad.write_text(GOOD + NATIVE_CASES["deep nesting"][0])
    sweep = tmp_path / "sweep"
    with pytest.raises(SystemExit) as stop:
        main(["run", "-m", "trace=file", f"trace.path={good},{bad}", "dataplane=sim", "logger=none",
              "progress=false", "plots=false", f"hydra.sweep.dir={sweep}"])
    err = capsys.readouterr().err
    assert stop.value.code == 1 and "2 jobs, 1 complete, 1 did not complete" in err and "Traceback" not in err
    error = next(sweep.glob("1_*")) / "error.txt"
    assert f"{bad}:2: JSON nested too deeply" in error.read_text()


def test_in_a_sweep_an_unforeseen_exception_fails_only_its_job(tmp_path, capsys, monkeypatch):
    import policylab.apps.run as run_module

    def explode(cfg, seed=0):
        raise RecursionError("maximum recursion depth exceeded somewhere unforeseen")
    monkeypatch.setattr(run_module, "load_trace", explode)
    sweep = tmp_path / "sweep"
    with pytest.raises(SystemExit) as stop:
        main(["run", "-m", "trace=poisson", "seed=0,1", "dataplane=sim", "logger=none", "progress=false",
              "plots=false", f"hydra.sweep.dir={sweep}"])
    err = capsys.readouterr().err
    assert stop.value.code == 1 and "2 jobs, 0 complete, 2 did not complete" in err
    for job in sweep.glob("[01]_*"):
        assert "RecursionError: maximum recursion depth" in (job / "error.txt").read_text()
        assert "Traceback" in (job / "traceback.txt").read_text()
