"""Parquet traces with the native columns, for traces too large for JSONL.

Read in record batches (never the whole file at once) and validated like native JSONL;
error "lines" are 1-based row numbers. Missing optional columns and nulls take the defaults;
an unknown column is an error, as an unknown key is in JSONL.
"""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator, Optional

from policylab.core.request import MAX_TOKENS, TraceRequest
from policylab.traces.errors import TraceError
from policylab.traces.raw import RawRequest
from policylab.traces.native import DEFAULTS, OPTIONAL, REQUIRED, record_of, request_from_record

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
        clean = None if client_column else clean_batch(batch)
        if clean is not None:
            row += len(clean)
            yield from clean
            continue
        for rec in batch.to_pylist():
            row += 1
            rec = {k: v for k, v in rec.items() if v is not None}
            try:
                yield request_from_record(rec, name, row, client_column)
            except TraceError as e:   # say "column": a parquet field is a column
                raise TraceError(name, row, e.field, e.message, kind="column") from None


def clean_batch(batch) -> Optional[list]:
    """The batch's requests, built column by column, when every value is one the row checks
    (`request_from_record`) accept as it is: typed columns, values in range, nulls only where
    a default stands in. Else None: the batch goes row by row, and the first bad row is named.
    Prefix ids always go row by row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = dict(zip(batch.schema.names, batch.columns))
    if "prefix_hashes" in columns or "spec_acceptance" in columns:    # (read row by row)
        return None

    def within(name, is_type, low, high, required=False, above=False) -> bool:
        c = columns.get(name)
        if c is None:
            return not required
        if not is_type(c.type) or (required and c.null_count):
            return False
        if c.null_count == len(c):
            return True
        if pa.types.is_floating(c.type) and not pc.all(pc.is_finite(pc.drop_null(c))).as_py():
            return False
        lo, hi = pc.min_max(c).values()
        return (lo.as_py() > low if above else lo.as_py() >= low) and hi.as_py() <= high

    def number(t) -> bool:
        return pa.types.is_integer(t) or pa.types.is_floating(t)

    def text(t) -> bool:
        return pa.types.is_string(t) or pa.types.is_large_string(t)

    if not (within("arrival_time", number, 0, math.inf, required=True)
            and all(within(k, pa.types.is_integer, 1, MAX_TOKENS, required=True) for k in REQUIRED[1:])
            and within("priority", pa.types.is_integer, -MAX_TOKENS, MAX_TOKENS)
            and all(within(k, number, 0, math.inf, above=True) for k in ("ttft_slo", "tpot_slo"))
            and within("max_tokens", pa.types.is_integer, 1, MAX_TOKENS)
            and ("client" not in columns or (text(columns["client"].type)      # (nulls: the default)
                                             and pc.min(pc.utf8_length(columns["client"])).as_py() != 0))):
        return None

    def values(name, default=None, cast=None) -> list:
        c = columns.get(name)
        if c is None:
            return [default] * batch.num_rows
        vals = c.to_pylist()
        if cast is not None and not pa.types.is_floating(c.type):
            vals = [v if v is None else cast(v) for v in vals]
        return [default if v is None else v for v in vals] if c.null_count else vals

    return [RawRequest(*fields, (), max_tokens) for *fields, max_tokens in zip(
        values("arrival_time", cast=float), values("prompt_tokens"), values("output_tokens"),
        values("client", DEFAULTS.client), values("priority", DEFAULTS.priority),
        values("ttft_slo", cast=float), values("tpot_slo", cast=float), values("max_tokens"))]


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
