"""Field checks shared by the readers: each returns the clean value or raises TraceError."""
from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

from policylab.core.request import MAX_ARRIVAL_S, MAX_TOKENS
from policylab.traces.errors import TraceError, shown


MAX_LINE_CHARS = 1 << 24        # 16 Mi characters: a record with a long prefix list is far shorter
MAX_BLANK_LINES = 1_000_000     # blank lines in one file: past it the file is not a trace
GZIP_MAX_RATIO = 200            # text traces compress 5-50x; a bomb expands thousands of times
GZIP_ALLOWANCE = 64 << 20       # characters any .gz may expand to whatever its ratio
MAX_ARRIVAL_VALUE = 1e15        # s, or ms (Mooncake): 31 million years, past any clock's epoch
MAX_SECONDS = MAX_ARRIVAL_S    # every time field (SLOs, think times, tool calls): as far as an arrival may be
MAX_SLO_S = MAX_SECONDS
MAX_SAMPLES = 10_000           # samples or beams of one request: the most per problem in published
                               # repeated-sampling studies (Brown et al. 2024, "Large Language Monkeys")


def open_text(path: Path):
    """Text handle on a trace file; `.gz` files are decompressed on the fly (streamed). A UTF-8
    byte order mark (as spreadsheet programs write) is dropped."""
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return open(path, "r", encoding="utf-8-sig", newline="")


def trace_lines(path: Path, name: str):
    """(line number, line) of a text trace, each line bounded in length, a `.gz` bounded in how
    far it expands and any file in its blank lines: a small file that decompresses to one huge
    line or to billions of blank ones is refused in one line, not read for minutes."""
    limit = max(GZIP_ALLOWANCE, GZIP_MAX_RATIO * path.stat().st_size) if str(path).endswith(".gz") else 0
    read = blank = 0
    with open_text(path) as f:
        for line_no in range(1, 1 << 62):
            line = f.readline(MAX_LINE_CHARS + 1)
            if not line:
                return
            if len(line) > MAX_LINE_CHARS:
                raise TraceError(name, line_no, None, f"a line longer than {MAX_LINE_CHARS:,} characters: "
                                                      "not a trace record")
            read += len(line)
            if limit and read > limit:
                raise TraceError(name, line_no, None, f"expands to more than {limit:,} characters from "
                                 f"{path.stat().st_size:,} compressed bytes ({GZIP_MAX_RATIO}x): not a trace")
            if not line.strip():
                blank += 1
                if blank > MAX_BLANK_LINES:
                    raise TraceError(name, line_no, None, f"more than {MAX_BLANK_LINES:,} blank lines: "
                                                          "not a trace")
            yield line_no, line


def parse_json_line(line: str, name: str, line_no: int):
    """One JSON value, or a TraceError at that line (bad syntax, nesting too deep, an integer
    of more digits than Python converts)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise TraceError(name, line_no, None, f"not valid JSON ({e.msg}, column {e.colno})") from None
    except RecursionError:
        raise TraceError(name, line_no, None, "JSON nested too deeply to be a trace record") from None
    except ValueError as e:             # (an integer past Python's digit limit)
        raise TraceError(name, line_no, None, f"not a readable JSON record ({e})") from None


def json_records(path: Path, name: str):
    """(line number, object) for each non-blank line of a JSONL file; bad lines raise TraceError."""
    for line_no, line in trace_lines(path, name):
        if line.strip():
            rec = parse_json_line(line, name, line_no)
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
    # (compared, not converted: a 400-digit integer overflows float(); NaN fails every comparison)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_ARRIVAL_VALUE:
        raise TraceError(file, line, field, f"expected a finite number of seconds >= 0 (at most "
                                            f"{MAX_ARRIVAL_VALUE:.0e}), got {shown(value)}", kind=kind)
    return float(value)


def seconds(value, file, line, field) -> float:
    """A duration in seconds: a finite number >= 0, at most MAX_SECONDS (as an arrival)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_SECONDS:
        raise TraceError(file, line, field, f"expected a finite number of seconds >= 0 (at most "
                                            f"{MAX_SECONDS:.0e}), got {shown(value)}")
    return float(value)


def samples(value, file, line, field) -> int:
    """Samples or beams of one request: a positive integer up to MAX_SAMPLES."""
    value = positive_int(value, file, line, field)
    if value > MAX_SAMPLES:
        raise TraceError(file, line, field, f"expected at most {MAX_SAMPLES:,} (samples or beams of one request), "
                                            f"got {value:,}")
    return value


def optional_seconds(value, file, line, field):
    """An SLO in seconds: null, or a finite number > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_SLO_S:
        raise TraceError(file, line, field, f"expected a positive number of seconds (at most {MAX_SLO_S:.0e}) "
                                            f"or null, got {shown(value)}")
    return float(value)


def optional_fraction(value, file, line, field):
    """A rate: null, or a number in [0, 1]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise TraceError(file, line, field, f"expected a number in [0, 1] or null, got {shown(value)}")
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


def fork_lengths(value, n: int, file, line, field) -> tuple:
    """Output lengths of a request's samples beyond its first: none (each generates
    `output_tokens`) or exactly n - 1 positive integers."""
    if not isinstance(value, (list, tuple)):
        raise TraceError(file, line, field, f"expected a list of output lengths, got {shown(value)}")
    if value and len(value) != n - 1:
        raise TraceError(file, line, field, f"expected {n - 1} output lengths (one per sample beyond the "
                                            f"first, n={n}), got {len(value)}")
    return tuple(positive_int(v, file, line, field) for v in value)


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
