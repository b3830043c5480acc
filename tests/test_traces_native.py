"""Native JSONL traces: round trips, validation errors that name file:line and field, path lookup."""
import json
import os

import pytest
from hypothesis import given, strategies as st

from policylab.core.request import TraceRequest
from policylab.traces import TraceConfig, TraceError, load_trace, write_native
from policylab.traces.native import read_native
from policylab.traces.load import SHIPPED_TRACES, resolve_path


def _write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _read(path):
    from collections import Counter
    return [TraceRequest(*raw) for raw in read_native(path, str(path), Counter())]


requests = st.builds(
    TraceRequest,
    arrival_time=st.floats(0, 1e6, allow_nan=False),
    prompt_tokens=st.integers(1, 100_000),
    output_tokens=st.integers(1, 10_000),
    client=st.text(min_size=1, max_size=8),
    priority=st.integers(-5, 5),
    ttft_slo=st.none() | st.floats(0.001, 100),
    tpot_slo=st.none() | st.floats(0.001, 10),
    prefix_hashes=st.lists(st.integers(0, 2**40) | st.text(min_size=1, max_size=4), max_size=5).map(tuple),
    max_tokens=st.none() | st.integers(1, 4096),
)


@given(st.lists(requests, max_size=20))
def test_write_then_read_gives_the_same_requests(tmp_path_factory, reqs):
    path = tmp_path_factory.mktemp("rt") / "t.jsonl"
    assert write_native(path, reqs) == len(reqs)
    assert _read(path) == reqs


def test_gzip_round_trip_and_defaults_left_out(tmp_path):
    reqs = [TraceRequest(0.5, 10, 3), TraceRequest(1.25, 7, 2, "a", 1, 0.5, 0.05, (1, 2), 9)]
    write_native(tmp_path / "t.jsonl", reqs)
    assert json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0]) == \
        {"arrival_time": 0.5, "prompt_tokens": 10, "output_tokens": 3}
    write_native(tmp_path / "t.jsonl.gz", reqs)
    assert _read(tmp_path / "t.jsonl.gz") == reqs


GOOD = '"arrival_time": 1.0, "prompt_tokens": 5, "output_tokens": 2'
BAD_RECORDS = [
    ('{"arrival_time": 1.0, "prompt_tokens": "abc", "output_tokens": 2}', "prompt_tokens",
     'expected a positive integer, got "abc"'),
    ('{"arrival_time": 1.0, "prompt_tokens": 0, "output_tokens": 2}', "prompt_tokens", "positive integer"),
    ('{"arrival_time": 1.0, "prompt_tokens": 2.5, "output_tokens": 2}', "prompt_tokens", "got 2.5"),
    ('{"arrival_time": 1.0, "prompt_tokens": true, "output_tokens": 2}', "prompt_tokens", "got True"),
    ('{"arrival_time": 1.0, "prompt_tokens": 5, "output_tokens": -1}', "output_tokens", "got -1"),
    ('{"arrival_time": -0.5, "prompt_tokens": 5, "output_tokens": 2}', "arrival_time", ">= 0"),
    ('{"arrival_time": "soon", "prompt_tokens": 5, "output_tokens": 2}', "arrival_time", '"soon"'),
    ('{"arrival_time": NaN, "prompt_tokens": 5, "output_tokens": 2}', "arrival_time", "finite"),
    ('{"arrival_time": Infinity, "prompt_tokens": 5, "output_tokens": 2}', "arrival_time", "finite"),
    ('{"prompt_tokens": 5, "output_tokens": 2}', "arrival_time", "missing"),
    ("{" + GOOD + ', "client": 7}', "client", "non-empty string"),
    ("{" + GOOD + ', "client": ""}', "client", "non-empty string"),
    ("{" + GOOD + ', "priority": "high"}', "priority", "integer"),
    ("{" + GOOD + ', "ttft_slo": 0}', "ttft_slo", "positive number of seconds"),
    ("{" + GOOD + ', "tpot_slo": "fast"}', "tpot_slo", "positive number of seconds"),
    ("{" + GOOD + ', "prefix_hashes": 5}', "prefix_hashes", "list of block ids"),
    ("{" + GOOD + ', "prefix_hashes": [1, 2.5]}', "prefix_hashes", "got element 2.5"),
    ("{" + GOOD + ', "max_tokens": 0}', "max_tokens", "positive integer"),
    ("{" + GOOD + ', "promt_tokens": 5}', "promt_tokens", "unknown field"),
]


@pytest.mark.parametrize("record,field,expected", BAD_RECORDS)
def test_bad_field_names_file_line_and_field(tmp_path, record, field, expected):
    path = _write_lines(tmp_path / "x.jsonl", ["{" + GOOD + "}", "", record])
    with pytest.raises(TraceError) as err:
        _read(path)
    assert (err.value.line, err.value.field) == (3, field)
    assert str(err.value).startswith(f"{path}:3: field '{field}': ")
    assert expected in str(err.value)


def test_error_message_format_matches_the_documented_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "traces").mkdir()
    _write_lines(tmp_path / "traces" / "x.jsonl", ["{" + GOOD + "}"] * 11 +
                 ['{"arrival_time": 1, "prompt_tokens": "abc", "output_tokens": 1}'])
    with pytest.raises(TraceError) as err:
        load_trace(TraceConfig(path="traces/x.jsonl"))
    assert str(err.value) == 'traces/x.jsonl:12: field \'prompt_tokens\': expected a positive integer, got "abc"'


@pytest.mark.parametrize("line,expected", [("{not json", "not valid JSON"), ("[1, 2]", "JSON object")])
def test_broken_lines_name_the_line(tmp_path, line, expected):
    path = _write_lines(tmp_path / "x.jsonl", ["{" + GOOD + "}", line])
    with pytest.raises(TraceError, match=rf"x.jsonl:2: .*{expected}"):
        _read(path)


def test_load_sorts_and_rebases_to_the_first_arrival(tmp_path):
    path = _write_lines(tmp_path / "x.jsonl", [
        '{"arrival_time": 12.0, "prompt_tokens": 3, "output_tokens": 1}',
        '{"arrival_time": 10.5, "prompt_tokens": 4, "output_tokens": 1}',
        '{"arrival_time": 11.0, "prompt_tokens": 5, "output_tokens": 1}'])
    trace = load_trace(TraceConfig(path=str(path)))
    assert [(r.arrival_time, r.prompt_tokens) for r in trace] == [(0.0, 4), (0.5, 5), (1.5, 3)]
    assert trace.report.read == trace.report.kept == 3


def test_relative_path_tries_cwd_then_shipped_traces(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_path("traces/poisson.jsonl") == SHIPPED_TRACES / "poisson.jsonl"
    (tmp_path / "traces").mkdir()
    _write_lines(tmp_path / "traces" / "poisson.jsonl", ["{" + GOOD + "}"])
    assert resolve_path("traces/poisson.jsonl") == tmp_path / "traces" / "poisson.jsonl"
    with pytest.raises(TraceError, match="file not found"):
        resolve_path("traces/none.jsonl")
    with pytest.raises(TraceError, match="trace.path=FILE"):
        resolve_path("???")
    assert os.getcwd() == str(tmp_path)


def test_empty_trace_is_an_error(tmp_path):
    with pytest.raises(TraceError, match="empty file"):
        load_trace(TraceConfig(path=str(_write_lines(tmp_path / "e.jsonl", [""]))))


def test_raw_request_mirrors_trace_request_field_for_field():
    """RawRequest, a namedtuple derived from TraceRequest, lines up with it for TraceRequest(*raw)."""
    from dataclasses import fields

    from policylab.core.request import TraceRequest
    from policylab.traces.raw import RawRequest
    trace_fields = [f.name for f in fields(TraceRequest)]
    assert list(RawRequest._fields) == trace_fields[:len(RawRequest._fields)]
    assert set(trace_fields[len(RawRequest._fields):]) == {"prompt_ids"}   # set only by `generate`
