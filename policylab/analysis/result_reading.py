"""Reading a run's result files back (requests.parquet, steps.parquet) for plots and W&B.

pandas' conversion of a whole arrow table holds the arrow table, a copy per dtype and the
consolidated frame at once: about three times the table, which at a million requests is the
largest memory a run ever needs, after the replay is over. Read a column at a time, the
frame costs itself and one column's arrow buffers: the same frame (columns, dtypes, values),
its columns kept as separate blocks.
"""
from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq


def read_columns(file, columns=None, row_groups: list | None = None) -> pd.DataFrame:
    """The table of `file` (a path or a `pyarrow.parquet.ParquetFile`) as a DataFrame: the
    columns named in `columns` (None: all), in the file's order; only `row_groups`, when given."""
    file = file if isinstance(file, pq.ParquetFile) else pq.ParquetFile(file)
    names = [c for c in file.schema_arrow.names if columns is None or c in columns]

    def column(name: str) -> pd.Series:
        table = file.read(columns=[name]) if row_groups is None else file.read_row_groups(row_groups, columns=[name])
        return table.column(0).to_pandas()

    return pd.DataFrame({name: column(name) for name in names}, copy=False)


def first_rows(file: pq.ParquetFile, rows: int, columns=None) -> pd.DataFrame:
    """The first `rows` rows of `file`, reading only the row groups that hold them."""
    meta, groups, held = file.metadata, [], 0
    while held < rows and len(groups) < meta.num_row_groups:
        held += meta.row_group(len(groups)).num_rows
        groups.append(len(groups))
    return read_columns(file, columns, groups).head(rows)
