"""policylab native traces (DESIGN §9): one JSON object per line, validated while streaming.

Required: `arrival_time` (s), `prompt_tokens`, `output_tokens`; optional: `client`, `priority`,
`ttft_slo`, `tpot_slo`, `prefix_hashes`, `max_tokens`, `spec_acceptance` (a speculative draft's
acceptance rate on the sim, in [0, 1]), `n` (parallel samples) and `fork_output_tokens` (the output
lengths of samples 1..n-1), `beam_width`, `tool_calls` (policylab.traces.tool_calls).
Unknown keys are errors (a typo must not
silently drop a field).
"""
from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator, Optional

from policylab.core.request import TraceRequest
import policylab.traces.fields as F
from policylab.traces.errors import TraceError
from policylab.traces.raw import RawRequest
from policylab.traces.tool_calls import parse_tool_calls, record_of_calls

REQUIRED = ("arrival_time", "prompt_tokens", "output_tokens")
OPTIONAL = ("client", "priority", "ttft_slo", "tpot_slo", "prefix_hashes", "max_tokens", "spec_acceptance", "n",
            "fork_output_tokens", "beam_width", "tool_calls")
DEFAULTS = RawRequest(0.0, 1, 1)


def request_from_record(rec: dict, file, line, client_column: Optional[str] = None) -> RawRequest:
    """Check one native record (a dict) and build its RawRequest."""
    allowed = REQUIRED + OPTIONAL + ((client_column,) if client_column else ())
    for key in rec:
        if key not in allowed:
            raise TraceError(file, line, key, f"unknown field; a native trace has {', '.join(allowed)}")
    for key in REQUIRED:
        if key not in rec:
            raise TraceError(file, line, key, "missing (required)")
    client = rec.get("client", DEFAULTS.client)
    if client_column:
        if client_column not in rec:
            raise TraceError(file, line, client_column, "missing (trace.client_column names it)")
        client = str(rec[client_column])
    max_tokens = rec.get("max_tokens")
    n = F.samples(rec.get("n", 1), file, line, "n")
    beam_width = F.samples(rec.get("beam_width", 1), file, line, "beam_width")
    if n > 1 and beam_width > 1:
        raise TraceError(file, line, "beam_width", f"a request has parallel samples (n={n}) or a beam, not both")
    output_tokens = F.positive_int(rec["output_tokens"], file, line, "output_tokens")
    return RawRequest(
        arrival_time=F.arrival(rec["arrival_time"], file, line, "arrival_time"),
        prompt_tokens=F.positive_int(rec["prompt_tokens"], file, line, "prompt_tokens"),
        output_tokens=output_tokens,
        client=F.text(client, file, line, "client"),
        priority=F.integer(rec.get("priority", 0), file, line, "priority"),
        ttft_slo=F.optional_seconds(rec.get("ttft_slo"), file, line, "ttft_slo"),
        tpot_slo=F.optional_seconds(rec.get("tpot_slo"), file, line, "tpot_slo"),
        prefix_hashes=F.block_ids(rec.get("prefix_hashes", []), file, line, "prefix_hashes"),
        max_tokens=None if max_tokens is None else F.positive_int(max_tokens, file, line, "max_tokens"),
        spec_acceptance=F.optional_fraction(rec.get("spec_acceptance"), file, line, "spec_acceptance"),
        n=n,
        beam_width=beam_width,
        fork_output_tokens=F.fork_lengths(rec.get("fork_output_tokens", []), n, file, line, "fork_output_tokens"),
        tool_calls=parse_tool_calls(rec["tool_calls"], output_tokens, file, line) if "tool_calls" in rec else (),
    )


def read_native(path: Path, name: str, skipped: Counter,
                client_column: Optional[str] = None) -> Iterator[RawRequest]:
    """Stream a native JSONL file; blank lines are allowed, anything else must be a valid record."""
    for line_no, rec in F.json_records(path, name):
        yield request_from_record(rec, name, line_no, client_column)


def record_of(r) -> dict:
    """The native record of a TraceRequest / RawRequest, leaving out defaults (smaller files)."""
    rec = {"arrival_time": r.arrival_time, "prompt_tokens": r.prompt_tokens,
           "output_tokens": r.output_tokens}
    for key in OPTIONAL:
        value = getattr(r, key)
        if value != getattr(DEFAULTS, key):
            rec[key] = list(value) if key in ("prefix_hashes", "fork_output_tokens") else record_of_calls(value) \
                if key == "tool_calls" else value
    return rec


def write_native(path, requests: Iterable[TraceRequest]) -> int:
    """Write requests as native JSONL (`.gz` compresses); returns how many were written."""
    path, n = Path(path), 0
    with _open_write(path) as f:
        for r in requests:
            f.write(json.dumps(record_of(r)) + "\n")
            n += 1
    return n


def _open_write(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        return gzip.open(path, "wt", encoding="utf-8")
    return open(path, "w", encoding="utf-8")
