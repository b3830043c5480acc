"""Public trace readers (Azure, Mooncake, BurstGPT, Vidur, Parquet) on inline files and the shared samples."""
from pathlib import Path

import pytest

from policylab.core.request import TraceRequest
from policylab.traces import TraceConfig, TraceError, load_trace
from policylab.traces.formats import detect_format
from policylab.traces.parquet import write_parquet

SHARED = Path(__file__).parents[1].parent / "shared" / "traces"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"public trace samples not found at {SHARED}")


def _file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _load(path, **kw):
    return load_trace(TraceConfig(path=path, **kw))


AZURE_2023 = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:03.9799600,4808,10
2023-11-16 18:17:04.0319600,3180,8
2023-11-16 18:17:05.0000000,0,8
2023-11-16 18:17:06.5000000,100,0
2023-11-16 18:17:07.9799600,110,27"""
AZURE_2024 = """TIMESTAMP,ContextTokens,GeneratedTokens
2024-05-10 00:00:00.0099300+00:00,1000,20
2024-05-10 00:00:01.5099300+00:00,50,3
"""


def test_azure_2023_relative_times_and_skipped_rows(tmp_path):
    trace = _load(_file(tmp_path, "a.csv", AZURE_2023))
    assert [(round(r.arrival_time, 6), r.prompt_tokens, r.output_tokens) for r in trace] == \
        [(0.0, 4808, 10), (0.052, 3180, 8), (4.0, 110, 27)]
    assert trace.report.skipped == {"ContextTokens <= 0": 1, "GeneratedTokens <= 0": 1}
    assert "skipped 1: ContextTokens <= 0" in trace.report.summary()


def test_azure_2024_timezone_suffix(tmp_path):
    trace = _load(_file(tmp_path, "a.csv", AZURE_2024))
    assert trace.report.format == "azure"
    assert trace[1].arrival_time == pytest.approx(1.5, abs=1e-6)


@pytest.mark.parametrize("row,column,expected", [
    ("2023-11-16 18:17:03.9,abc,10", "ContextTokens", 'expected a number, got "abc"'),
    ("2023-11-16 18:17:03.9,12.5,10", "ContextTokens", "whole number"),
    ("yesterday,12,10", "TIMESTAMP", 'got "yesterday"'),
    ("2023-11-16 18:17:03.9,12,", "GeneratedTokens", 'got ""'),
])
def test_azure_bad_cells_name_line_and_column(tmp_path, row, column, expected):
    path = _file(tmp_path, "a.csv", AZURE_2024 + row + "\n")
    with pytest.raises(TraceError) as err:
        _load(path)
    assert str(err.value).startswith(f"{path}:4: column '{column}': ") and expected in str(err.value)


def test_short_row_and_missing_column(tmp_path):
    with pytest.raises(TraceError, match=r"a.csv:4: expected 3 cells"):
        _load(_file(tmp_path, "a.csv", AZURE_2024 + "2024-05-10 00:00:02,5\n"))
    with pytest.raises(TraceError, match=r"v.csv:1: column 'num_decode_tokens': missing from the header"):
        _load(_file(tmp_path, "v.csv", "arrived_at,num_prefill_tokens\n0,1\n"), format="vidur")


MOONCAKE = """{"timestamp": 0, "input_length": 1500, "output_length": 6, "hash_ids": [0, 1, 2]}
{"timestamp": 250, "input_length": 1100, "output_length": 4, "hash_ids": [0, 1, 3]}
{"timestamp": 900, "input_length": 0, "output_length": 4, "hash_ids": []}
{"timestamp": 1000, "input_length": 600, "output_length": 3, "hash_ids": [0, 4]}
"""


def test_mooncake_ms_to_seconds_and_hash_ids_to_prefix_hashes(tmp_path):
    trace = _load(_file(tmp_path, "m.jsonl", MOONCAKE), prefix_block_tokens=512)
    assert [(r.arrival_time, r.prefix_hashes) for r in trace] == [(0.0, (0, 1, 2)), (0.25, (0, 1, 3)), (1.0, (0, 4))]
    assert trace.report.skipped == {"input_length <= 0": 1}


def test_mooncake_prefixes_become_identical_prompt_tokens():
    from policylab.core.synthetic_prompts import synthesize_prompt
    a = synthesize_prompt(0, 1500, (0, 1, 2), 32000, prefix_block_tokens=512)
    b = synthesize_prompt(1, 1100, (0, 1, 3), 32000, prefix_block_tokens=512)
    assert (a[:1024] == b[:1024]).all() and not (a[1024:1100] == b[1024:1100]).all()


def test_mooncake_bad_field(tmp_path):
    path = _file(tmp_path, "m.jsonl", MOONCAKE + '{"timestamp": 5, "input_length": "x", "output_length": 1}\n')
    with pytest.raises(TraceError, match=r"m.jsonl:5: field 'input_length': expected an integer"):
        _load(path)


BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,276,693,Conversation log
130,ChatGPT,300,20,320,API log
"""
BURSTGPT_SESSIONS = """Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type
0.5,s1,1.2,ChatGPT,10,5,15,Conversation log
2.0,s2,0.4,ChatGPT,20,6,26,Conversation log
3.5,s1,2.0,ChatGPT,30,7,37,Conversation log
"""


def test_burstgpt_failed_rows_skipped_and_filters(tmp_path):
    path = _file(tmp_path, "b.csv", BURSTGPT)
    trace = _load(path)
    assert [(r.arrival_time, r.prompt_tokens) for r in trace] == [(0.0, 472), (113.0, 417), (125.0, 300)]
    assert trace.report.skipped == {"failed (0 response tokens)": 1}
    chat = _load(path, extra={"model": "ChatGPT", "log_type": "Conversation log"})
    assert [r.prompt_tokens for r in chat] == [472]
    assert chat.report.skipped == {"failed (0 response tokens)": 1, "other model": 1, "other log type": 1}
    assert len(_load(path, extra={"model": ["ChatGPT", "GPT-4"]})) == 3
    with pytest.raises(TraceError, match="extra.modle.*takes: model, log_type"):
        _load(path, extra={"modle": "x"})


def test_burstgpt_with_session_columns_and_client_column(tmp_path):
    trace = _load(_file(tmp_path, "b.csv", BURSTGPT_SESSIONS), client_assignment="column", client_column="Session ID")
    assert trace.report.format == "burstgpt"
    assert [(r.arrival_time, r.client) for r in trace] == [(0.0, "s1"), (1.5, "s2"), (3.0, "s1")]


def test_vidur_reader(tmp_path):
    text = "arrived_at,num_prefill_tokens,num_decode_tokens,num_total_tokens\n0.5,100,10,110\n1.25,0,3,3\n2.0,50,5,55\n"
    trace = _load(_file(tmp_path, "v.csv", text))
    assert [(r.arrival_time, r.prompt_tokens, r.output_tokens) for r in trace] == [(0.0, 100, 10), (1.5, 50, 5)]
    assert trace.report.skipped == {"num_prefill_tokens <= 0": 1}


def test_parquet_round_trip_and_errors(tmp_path):
    reqs = [TraceRequest(0.0, 10, 2, "a", prefix_hashes=(1, 2)), TraceRequest(0.5, 20, 3, ttft_slo=1.0)]
    write_parquet(tmp_path / "t.parquet", reqs)
    assert list(_load(str(tmp_path / "t.parquet"))) == reqs
    bad = [TraceRequest(0.0, 10, 2), TraceRequest(0.5, 0, 3)]   # TraceRequest itself does not validate
    write_parquet(tmp_path / "bad.parquet", bad)
    with pytest.raises(TraceError, match=r"bad.parquet:2: column 'prompt_tokens': expected a positive integer"):
        _load(str(tmp_path / "bad.parquet"))
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(TraceError, match="not a readable parquet file"):
        _load(str(tmp_path / "junk.parquet"))


def test_unknown_format_is_explained(tmp_path):
    path = _file(tmp_path, "x.csv", "when,prompt,output\n1,2,3\n")
    with pytest.raises(TraceError, match="cannot tell the trace format.*TIMESTAMP,ContextTokens"):
        _load(path)
    with pytest.raises(TraceError, match="unknown trace format 'csv'"):
        _load(path, format="csv")


def test_gzip_files_are_detected_and_read(tmp_path):
    import gzip
    with gzip.open(tmp_path / "a.csv.gz", "wt") as f:
        f.write(AZURE_2024)
    assert detect_format(tmp_path / "a.csv.gz", "a") == "azure"
    assert len(_load(str(tmp_path / "a.csv.gz"))) == 2


@needs_shared
def test_shared_azure_sample():
    trace = _load(str(SHARED / "azure_code_2023.csv"))
    assert len(trace) == 8819 and trace.report.format == "azure" and not trace.report.skipped
    assert trace[0].arrival_time == 0.0 and 3400 < trace[-1].arrival_time < 3500   # ~58 minutes


@needs_shared
def test_shared_mooncake_sample():
    trace = _load(str(SHARED / "mooncake_synthetic.jsonl"), max_prompt_tokens=8192)
    assert len(trace) == 3993 and trace.report.format == "mooncake"
    assert trace.report.clipped_prompts > 0
    assert all(len(r.prefix_hashes) <= 16 for r in trace)     # 8192 / 512 blocks after clipping


def test_parquet_columns_read_at_once_equal_the_row_checks(tmp_path, monkeypatch):
    """A clean batch is built column by column (`clean_batch`); the row checks build the same
    requests, values and types (int columns for seconds, nulls for defaults, float32), and a
    batch with any value they refuse goes to them, so the error names the row."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from policylab.traces import parquet
    table = pa.table({"arrival_time": pa.array([0, 1, 2], pa.int64()), "prompt_tokens": [5, 6, 7],
                      "output_tokens": pa.array([1, 2, 3], pa.uint16()), "client": ["a", None, "b"],
                      "priority": pa.array([None, -3, 2], pa.int32()), "ttft_slo": pa.array([1, None, 2]),
                      "tpot_slo": pa.array([0.5, None, 0.1], pa.float32()), "max_tokens": pa.array([None, 4, None])})
    pq.write_table(table, tmp_path / "t.parquet")
    at_once = list(_load(str(tmp_path / "t.parquet")))
    monkeypatch.setattr(parquet, "clean_batch", lambda batch: None)
    by_row = list(_load(str(tmp_path / "t.parquet")))
    assert at_once == by_row and [list(map(type, vars(r).values())) for r in at_once] == \
        [list(map(type, vars(r).values())) for r in by_row]
    monkeypatch.undo()
    for column, values, row in [("arrival_time", [0.0, float("nan")], 2), ("prompt_tokens", [3.0, 4.0], 1),
                                ("client", ["x", ""], 2), ("ttft_slo", [1.0, 0.0], 2), ("priority", [True, False], 1),
                                ("max_tokens", [2, 0], 2)]:
        batch = pa.RecordBatch.from_pydict({"arrival_time": [0.0, 1.0], "prompt_tokens": [3, 4],
                                            "output_tokens": [1, 1], column: values})
        assert parquet.clean_batch(batch) is None, column
        pq.write_table(pa.Table.from_batches([batch]), tmp_path / "bad.parquet")
        with pytest.raises(TraceError, match=rf"bad.parquet:{row}: column '{column}'"):
            _load(str(tmp_path / "bad.parquet"))
