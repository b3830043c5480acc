"""CSV trace formats (DESIGN §9): Azure LLM inference 2023/2024, BurstGPT, Vidur/Splitwise.

Each reader streams rows with the csv module (a 1M-row file is read once), yields requests
with absolute arrival times in seconds, and counts rows it skips instead of failing on them
(zero-token rows, failed requests, rows filtered out). Malformed cells are errors naming the
file, line and column.
"""
from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

import policylab.traces.fields as F
from policylab.traces.csv_table import csv_rows
from policylab.traces.errors import TraceError, shown
from policylab.traces.raw import RawRequest


def _rows(path: Path, name: str, columns: Sequence[str], client_column: Optional[str]):
    """Yield (line number, cells of `columns` in that order, client or None) per data row."""
    wanted = list(columns) + ([client_column] if client_column else [])
    for line, cells in csv_rows(path, name, wanted, need_rows=False, expected="a CSV trace"):
        picked = [cells[c] for c in wanted]
        yield line, picked[:len(columns)], (picked[-1] if client_column else None)


def _request(t, prompt, output, client, skipped: Counter, prompt_col, output_col):
    """The request of a row, or None (counted in `skipped`) when a token count is not positive."""
    if prompt < 1:
        skipped[f"{prompt_col} <= 0"] += 1
        return None
    if output < 1:
        skipped[f"{output_col} <= 0"] += 1
        return None
    return RawRequest(t, prompt, output, client or "default")


def parse_timestamp(cell: str, name, line, column) -> float:
    """Azure timestamps ('2023-11-16 18:17:03.9799600', 2024 adds '+00:00') -> UTC epoch seconds."""
    try:
        stamp = datetime.fromisoformat(cell)
    except ValueError:
        raise TraceError(name, line, column, f"expected a timestamp like '2023-11-16 18:17:03.9799600', "
                                             f"got {shown(cell)}", kind="column") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def read_azure(path: Path, name: str, skipped: Counter,
               client_column: Optional[str] = None) -> Iterator[RawRequest]:
    """Azure LLM inference trace: TIMESTAMP,ContextTokens,GeneratedTokens."""
    cols = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    for line, (ts, ctx, gen), client in _rows(path, name, cols, client_column):
        r = _request(parse_timestamp(ts, name, line, cols[0]), F.cell_count(ctx, name, line, cols[1]),
                     F.cell_count(gen, name, line, cols[2]), client, skipped, cols[1], cols[2])
        if r is not None:
            yield r


def read_vidur(path: Path, name: str, skipped: Counter,
               client_column: Optional[str] = None) -> Iterator[RawRequest]:
    """Vidur / Splitwise request trace: arrived_at (s), num_prefill_tokens, num_decode_tokens."""
    cols = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
    for line, (at, pre, dec), client in _rows(path, name, cols, client_column):
        r = _request(F.arrival(F.cell_number(at, name, line, cols[0]), name, line, cols[0], kind="column"),
                     F.cell_count(pre, name, line, cols[1]),
                     F.cell_count(dec, name, line, cols[2]), client, skipped, cols[1], cols[2])
        if r is not None:
            yield r


def burstgpt_rows(path: Path, name: str, skipped: Counter, extra_column: Optional[str],
                  model: Union[str, Sequence[str], None] = None, log_type: Optional[str] = None):
    """BurstGPT's rows of the chosen `model` (one name or a list) and `log_type` that did not fail
    (0 response tokens; the others are counted in `skipped`): (line, arrival time, request tokens,
    response tokens, the `extra_column` cell or None)."""
    cols = ("Timestamp", "Model", "Request tokens", "Response tokens", "Log Type")
    models = {model} if isinstance(model, str) else (set(model) if model else None)
    for line, (ts, row_model, req, resp, row_log), extra in _rows(path, name, cols, extra_column):
        if models is not None and row_model not in models:
            skipped["other model"] += 1
            continue
        if log_type is not None and row_log != log_type:
            skipped["other log type"] += 1
            continue
        response = F.cell_count(resp, name, line, cols[3])
        if response == 0:
            skipped["failed (0 response tokens)"] += 1
            continue
        t = F.arrival(F.cell_number(ts, name, line, cols[0]), name, line, cols[0], kind="column")
        yield line, t, F.cell_count(req, name, line, cols[2]), response, extra


def read_burstgpt(path: Path, name: str, skipped: Counter, client_column: Optional[str] = None,
                  model: Union[str, Sequence[str], None] = None,
                  log_type: Optional[str] = None) -> Iterator[RawRequest]:
    """BurstGPT: Timestamp (s),Model,Request tokens,Response tokens,Total tokens,Log Type[,...].

    `model` (one name or a list) and `log_type` keep only matching rows; failed requests
    (0 response tokens) are skipped and counted.
    """
    for _, t, prompt, response, client in burstgpt_rows(path, name, skipped, client_column, model, log_type):
        r = _request(t, prompt, response, client, skipped, "Request tokens", "Response tokens")
        if r is not None:
            yield r
