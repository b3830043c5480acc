"""Which reader a trace file needs: named by `format`, or detected from its header / first keys."""
from __future__ import annotations

import csv
import inspect as pyinspect
from collections import Counter
from pathlib import Path
from typing import Iterator, Optional

import policylab.traces.fields as F
from policylab.traces.csv_formats import read_azure, read_burstgpt, read_vidur
from policylab.traces.errors import TraceError
from policylab.traces.mooncake import read_mooncake
from policylab.traces.native import read_native
from policylab.traces.parquet import read_parquet
from policylab.traces.raw import RawRequest

READERS = {
    "native": read_native,
    "azure": read_azure,
    "mooncake": read_mooncake,
    "burstgpt": read_burstgpt,
    "vidur": read_vidur,
    "parquet": read_parquet,
}
FORMATS = ("auto",) + tuple(READERS) + ("sessions",)
SIGNATURES = {   # what detection looks for, also shown when nothing matches
    "native": "JSON lines with arrival_time, prompt_tokens, output_tokens",
    "sessions": "JSON lines with session, turn, new_tokens, output_tokens (docs/sessions.md)",
    "mooncake": "JSON lines with timestamp, input_length, output_length[, hash_ids]",
    "azure": "CSV header TIMESTAMP,ContextTokens,GeneratedTokens",
    "burstgpt": "CSV header Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
    "vidur": "CSV header arrived_at,num_prefill_tokens,num_decode_tokens",
    "parquet": "a .parquet file with the native columns",
}


def detect_format(path: Path, name: str) -> str:
    """Format of a file from its suffix (parquet) or its first non-blank line."""
    if path.name.endswith((".parquet", ".pq")):
        return "parquet"
    line_no, first = next(((n, line) for n, line in F.trace_lines(path, name) if line.strip()), (None, ""))
    if not first:
        raise TraceError(name, None, None, "empty file: no header and no requests")
    if first.lstrip().startswith("{"):
        record = F.parse_json_line(first, name, line_no)
        keys = set(record) if isinstance(record, dict) else set()
        if {"session", "turn"} <= keys:
            return "sessions"
        if "arrival_time" in keys:
            return "native"
        if "input_length" in keys:
            return "mooncake"
    else:
        header = {h.strip() for h in next(csv.reader([first]))}
        if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= header:
            return "azure"
        if {"Request tokens", "Response tokens"} <= header:
            return "burstgpt"
        if "arrived_at" in header:
            return "vidur"
    known = "; ".join(f"{k}: {v}" for k, v in SIGNATURES.items())
    raise TraceError(name, line_no, None, f"cannot tell the trace format from {first.strip()[:80]!r}. "
                                    f"Known formats — {known}. Set trace.format to force one.")


def read_requests(path: Path, name: str, fmt: str, skipped: Counter,
                  client_column: Optional[str] = None, options: Optional[dict] = None
                  ) -> Iterator[RawRequest]:
    """Stream the requests of a file (absolute arrival seconds, file order)."""
    if fmt == "auto":
        fmt = detect_format(path, name)
    if fmt not in READERS:
        raise TraceError(name, None, "format", f"unknown trace format '{fmt}'; choose one of {FORMATS}")
    reader = READERS[fmt]
    accepted = [p for p in pyinspect.signature(reader).parameters
                if p not in ("path", "name", "skipped", "client_column")]
    for key in options or {}:
        if key not in accepted:
            raise TraceError(name, None, f"extra.{key}",
                             f"not an option of the {fmt} reader (it takes: {', '.join(accepted) or 'none'})")
    return reader(path, name, skipped, client_column, **(options or {}))
