"""The one CSV reader: a table of named columns, every problem one `TraceError` naming the file,
the line and the column (the public trace formats and `sim-check`'s measurements read through it).

What a hand-made or exported CSV brings, each refused or accepted in one line: a UTF-8 byte
order mark (accepted: spreadsheet programs write one), a `.gz` (read as its text, bounded as a
trace is), a binary or non-UTF-8 file (refused with the file's name and the first bad byte), a
header with no rows, a row with more or fewer cells than the header, a cell past the csv
module's size limit, and a quote that is never closed (named at the line where it opens,
instead of swallowing the rest of the file into one cell).
"""
from __future__ import annotations

import csv
import gzip
import math
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Sequence

import policylab.traces.fields as F
from policylab.traces.errors import TraceError, shown


@contextmanager
def unreadable_as_trace_error(path: Path, name: str, expected: str = "a CSV or JSON-lines trace"):
    """A binary file, bad UTF-8 or a broken `.gz` becomes one TraceError naming the file."""
    try:
        yield
    except UnicodeDecodeError as e:
        line, column, byte = _first_non_utf8(path, e)
        raise TraceError(name, line, None, f"not UTF-8 text (byte 0x{byte:02x} at column {column}): "
                         f"expected {expected}") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise TraceError(name, None, None, f"not a valid, complete gzip file ({e})") from None
    except OSError as e:
        raise TraceError(name, None, None, f"cannot read the file ({e.strerror or e})") from None


def _first_non_utf8(path: Path, error: UnicodeDecodeError) -> tuple:
    """(line, column, byte) of the first byte that is not UTF-8 (the decoder only knows its chunk)."""
    with (gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")) as f:
        for line_no, raw in enumerate(f, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return line_no, e.start + 1, raw[e.start]
    return None, error.start + 1, error.object[error.start]


def csv_rows(path: Path, name: str, columns: Sequence[str], *, comments: bool = False, exact: bool = False,
             need_rows: bool = True, expected: str = "a CSV file", optional: Sequence[str] = ()) -> Iterator[tuple]:
    """(line number, {column: stripped cell}) per data row of the CSV at `path`, `name` being how
    messages call it. The header must hold `columns` (others are allowed; those of `optional` it holds
    are handed out too); blank lines are skipped, and with `comments` lines starting with `#` too;
    `exact`: a row has as many cells as the header (else at least as many). No data row at all is an
    error with `need_rows`."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(name, None, None, "no such file" if not path.exists() else f"not a file: {expected}")
    seen: list = []                      # file line numbers of the lines handed to the csv reader

    def lines():
        for line_no, line in F.trace_lines(path, name):
            if not line.strip() or comments and line.lstrip().startswith("#"):
                continue
            seen.append(line_no)
            yield line

    rows = 0
    with unreadable_as_trace_error(path, name, expected):
        reader = csv.reader(lines(), strict=True)
        header = _next_row(reader, seen, name)
        if header is None:
            raise TraceError(name, None, None, f"empty: expected {expected} with a header row")
        header = [h.strip() for h in header[1]]
        missing = [c for c in columns if c not in header]
        if missing:
            raise TraceError(name, seen[0], missing[0], f"missing from the header {shown(','.join(header), 120)} "
                             f"(expected columns {','.join(columns)})", kind="column")
        index = {c: header.index(c) for c in (*columns, *(c for c in optional if c in header))}
        while (row := _next_row(reader, seen, name)) is not None:
            line, cells = row
            if len(cells) == 1 and not cells[0].strip():
                continue
            if len(cells) < len(header) or exact and len(cells) != len(header):
                raise TraceError(name, line, None, f"expected {len(header)} cells like the header, got {len(cells)}")
            rows += 1
            yield line, {c: cells[i].strip() for c, i in index.items()}
    if not rows and need_rows:
        raise TraceError(name, None, None, "a header and no data rows")


def _next_row(reader, seen: list, name: str) -> Optional[tuple]:
    """(file line where the row starts, its cells), or None at the end; a csv error names the line."""
    start = len(seen)
    try:
        cells = next(reader)
    except StopIteration:
        return None
    except csv.Error as e:
        line = seen[start] if start < len(seen) else (seen[-1] if seen else None)
        if "unexpected end of data" in str(e):
            raise TraceError(name, line, None, 'a quote (") opened on this line is never closed') from None
        raise TraceError(name, line, None, f"not a readable CSV row ({e})") from None
    return seen[start], cells


def cell_value(cell: str, file, line, column, low: float, high: float, *, integer: bool = False,
               above: bool = False, unit: str = "") -> float:
    """A numeric cell within [low, high] (`above`: > low), whole when `integer`; anything else,
    NaN and infinities included, is named with its row and column and the range expected."""
    unit = f" {unit}" if unit else ""
    lo, hi = (f"{int(v):,}" if integer else f"{v:g}" for v in (low, high))
    what = (f"{'an integer' if integer else 'a number'} {'>' if above else 'from'} {lo}{unit}"
            f"{' and' if above else ' to'} {'at most ' if above else ''}{hi}{unit}")
    try:
        value = float(cell) if not integer else int(cell)
    except ValueError:
        value = math.nan
        if integer:                       # ('8.0' and '1e3' are whole numbers too)
            try:
                value = float(cell)
                value = int(value) if value.is_integer() else math.nan
            except (ValueError, OverflowError):
                value = math.nan
    ok = not (isinstance(value, float) and math.isnan(value)) and (low < value if above else low <= value) \
        and value <= high
    if not ok:
        raise TraceError(file, line, column, f"expected {what}, got {shown(cell)}", kind="column")
    return value
