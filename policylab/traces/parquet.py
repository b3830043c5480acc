"""Parquet traces with the native columns, for traces too large for JSONL.

Read in record batches (never the whole file at once) and validated like native JSONL;
error "lines" are 1-based row numbers. Missing optional columns and nulls take the defaults;
an unknown column is an error, as an unknown key is in JSONL.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator, Optional

from policylab.core.request import TraceRequest
from policylab.traces.errors import TraceError
from policylab.traces.raw import RawRequest
from policylab.traces.native import OPTIONAL, REQUIRED, record_of, request_from_record

BATCH_ROWS = 65536


def read_parquet(path: Path, name: str, skipped: Counter,
                 client_column: Optional[str] = None) -> Iterator[RawRequest]:
    import pyarrow.parquet as pq   # lazy: only parquet users pay for the import

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:   # pyarrow raises several types for a non-parquet file
        raise TraceError(name, None, None, f"not a readable parquet file ({e})") from None
    allowed = REQUIRED + OPTIONAL + ((client_column,) if client_column else ())
    unknown = [c for c in pf.schema_arrow.names if c not in allowed]
    if unknown:     # as native JSONL refuses an unknown key: a typo must not silently drop a field
        raise TraceError(name, None, unknown[0], f"unknown column; a native parquet trace has {', '.join(allowed)}",
                         kind="column")
    wanted = [c for c in allowed if c in pf.schema_arrow.names]
    row = 0
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=wanted):
        for rec in batch.to_pylist():
            row += 1
            rec = {k: v for k, v in rec.items() if v is not None}
            try:
                yield request_from_record(rec, name, row, client_column)
            except TraceError as e:   # say "column": a parquet field is a column
                raise TraceError(name, row, e.field, e.message, kind="column") from None


def write_parquet(path, requests: Iterable[TraceRequest]) -> int:
    """Write native columns; optional columns only when some request sets them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [record_of(r) for r in requests]
    columns = {k: [] for k in REQUIRED + OPTIONAL}
    for rec in records:
        for k in columns:
            columns[k].append(rec.get(k))
    if any(columns["prefix_hashes"]) and not all(isinstance(h, int) for hs in columns["prefix_hashes"]
                                                  if hs for h in hs):
        columns["prefix_hashes"] = [[str(h) for h in hs] if hs else None for hs in columns["prefix_hashes"]]
    table = pa.table({k: v for k, v in columns.items() if k in REQUIRED or any(x is not None for x in v)})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return len(records)
