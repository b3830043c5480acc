"""Field checks shared by the readers: each returns the clean value or raises TraceError."""
from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

from policylab.core.request import MAX_TOKENS
from policylab.traces.errors import TraceError, shown


def open_text(path: Path):
    """Text handle on a trace file; `.gz` files are decompressed on the fly (streamed)."""
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return open(path, "r", encoding="utf-8", newline="")


def json_records(path: Path, name: str):
    """(line number, object) for each non-blank line of a JSONL file; bad lines raise TraceError."""
    with open_text(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceError(name, line_no, None, f"not valid JSON ({e.msg}, column {e.colno})") from None
            if not isinstance(rec, dict):
                raise TraceError(name, line_no, None, "expected a JSON object per line")
            yield line_no, rec


def positive_int(value, file, line, field, kind="field") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TraceError(file, line, field, f"expected a positive integer, got {shown(value)}", kind=kind)
    if value > MAX_TOKENS:
        raise TraceError(file, line, field, f"expected a positive integer up to {MAX_TOKENS:.0e}, "
                                            f"got {shown(value)}", kind=kind)
    return value


def arrival(value, file, line, field, kind="field") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0:
        raise TraceError(file, line, field,
                         f"expected a finite number of seconds >= 0, got {shown(value)}", kind=kind)
    return float(value)


def optional_seconds(value, file, line, field):
    """An SLO in seconds: null, or a finite number > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise TraceError(file, line, field, f"expected a positive number of seconds or null, "
                                            f"got {shown(value)}")
    return float(value)


def integer(value, file, line, field) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(file, line, field, f"expected an integer, got {shown(value)}")
    if abs(value) > MAX_TOKENS:
        raise TraceError(file, line, field, f"expected an integer of at most {MAX_TOKENS:.0e} in size, "
                                            f"got {shown(value)}")
    return value


def text(value, file, line, field) -> str:
    if not isinstance(value, str) or not value:
        raise TraceError(file, line, field, f"expected a non-empty string, got {shown(value)}")
    return value


def block_ids(value, file, line, field) -> tuple:
    """Prefix block ids: a list of integers or strings (equal ids = shared prefix block)."""
    if not isinstance(value, (list, tuple)):
        raise TraceError(file, line, field, f"expected a list of block ids, got {shown(value)}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (int, str)):
            raise TraceError(file, line, field,
                             f"expected block ids (integers or strings), got element {shown(item)}")
    return tuple(value)


def cell_number(cell: str, file, line, column) -> float:
    """A numeric CSV cell ('12', '12.0', '1e3'); text that is not a finite number is an error."""
    try:
        value = float(cell)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise TraceError(file, line, column, f"expected a number, got {shown(cell)}", kind="column")
    return value


def cell_count(cell: str, file, line, column) -> int:
    """A token count cell: a whole number (0 and negatives pass; the caller skips and counts them)."""
    try:
        count = int(cell)
    except ValueError:
        value = cell_number(cell, file, line, column)
        if not value.is_integer():
            raise TraceError(file, line, column, f"expected a whole number of tokens, got {shown(cell)}",
                             kind="column") from None
        count = int(value)
    if count > MAX_TOKENS:
        raise TraceError(file, line, column, f"expected at most {MAX_TOKENS:.0e} tokens, got {shown(cell)}",
                         kind="column")
    return count
