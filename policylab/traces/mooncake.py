"""Mooncake traces (kvcache-ai/Mooncake, FAST'25): JSONL with `timestamp` (ms), `input_length`,
`output_length` and `hash_ids`, one id per 512-token block; equal ids mean a shared prefix.

The ids become `prefix_hashes`; replayed with `prefix_block_tokens=512` each id turns into the
same 512 synthetic tokens in every request that has it (policylab/core/synthetic_prompts.py), so Mooncake's
shared prefixes become prefix-cache hits at whatever block size the engine uses.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterator, Optional

import policylab.traces.fields as F
from policylab.traces.errors import TraceError
from policylab.traces.raw import RawRequest

BLOCK_TOKENS = 512   # tokens per hash id in the published traces


def read_mooncake(path: Path, name: str, skipped: Counter,
                  client_column: Optional[str] = None) -> Iterator[RawRequest]:
    for line_no, rec in F.json_records(path, name):
        for key in ("timestamp", "input_length", "output_length") + ((client_column,) if client_column else ()):
            if key not in rec:
                raise TraceError(name, line_no, key, "missing (required)")
        prompt = F.integer(rec["input_length"], name, line_no, "input_length")
        output = F.integer(rec["output_length"], name, line_no, "output_length")
        arrival_ms = F.arrival(rec["timestamp"], name, line_no, "timestamp")
        hashes = F.block_ids(rec.get("hash_ids", []), name, line_no, "hash_ids")
        if prompt < 1:
            skipped["input_length <= 0"] += 1
            continue
        if output < 1:
            skipped["output_length <= 0"] += 1
            continue
        client = str(rec[client_column]) if client_column else "default"
        yield RawRequest(arrival_ms / 1000.0, prompt, output, client, prefix_hashes=hashes)
