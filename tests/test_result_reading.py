"""Result files read back a column at a time (policylab.analysis.result_reading): the same frame
as pandas' whole-table read, and the first rows from the row groups that hold them only."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from policylab.analysis.result_reading import first_rows, read_columns

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def result_file(tmp_path):
    """A table with the kinds of column result files have: ints, floats with NaN, strings with
    missing values, bools and a list column, in row groups of 7."""
    n = 40
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"req_id": np.arange(n), "ttft": np.where(rng.random(n) < 0.2, np.nan, rng.random(n)),
                          "status": rng.choice(["finished", "rejected"], n), "slo_met": rng.random(n) < 0.5,
                          "reason": [None if i % 3 else f"r{i}" for i in range(n)]})
    table = pa.Table.from_pandas(frame, preserve_index=False).append_column(
        "token_times", pa.array([list(rng.random(i % 4)) for i in range(n)], pa.list_(pa.float64())))
    path = tmp_path / "requests.parquet"
    pq.write_table(table, path, row_group_size=7)
    return path


def test_a_column_at_a_time_is_the_frame_pandas_reads(result_file):
    for columns in (None, ["status", "ttft", "token_times"], ["reason"]):
        got, want = read_columns(result_file, columns), pd.read_parquet(result_file, columns=columns)
        assert list(got.columns) == list(pq.ParquetFile(result_file).schema_arrow.names if columns is None else
                                          [c for c in pq.ParquetFile(result_file).schema_arrow.names if c in columns])
        assert (got.dtypes == want[got.columns].dtypes).all()
        assert got.drop(columns="token_times", errors="ignore").equals(
            want[got.columns].drop(columns="token_times", errors="ignore"))
        if "token_times" in got:
            assert [list(x) for x in got["token_times"]] == [list(x) for x in want["token_times"]]


def test_the_first_rows_come_from_their_row_groups_alone(result_file, monkeypatch):
    read = []
    original = pq.ParquetFile.read_row_groups
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups",
                        lambda self, groups, **kw: read.append(list(groups)) or original(self, groups, **kw))
    got = first_rows(pq.ParquetFile(result_file), 10, ["req_id", "status"])
    assert got.equals(pd.read_parquet(result_file, columns=["req_id", "status"]).head(10))
    assert read and all(groups == [0, 1] for groups in read)      # rows 0-13: two groups of 7
    assert len(first_rows(pq.ParquetFile(result_file), 1000)) == 40               # more than the file: all of it
