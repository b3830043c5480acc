"""Typed trace selection and transforms (the `trace` config group)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class TraceConfig:
    name: str = "file"
    path: str = ""                           # a file (relative: to the cwd, else the shipped traces), or a dataset name
    dataset: Optional[str] = None            # downloaded public trace read when path is empty (`trace list`)
    cache_dir: Optional[str] = None          # where downloads live (default: $POLICYLAB_CACHE, ~/.cache/policylab)
    format: str = "auto"                     # auto | native | azure | mooncake | burstgpt | vidur | parquet
    rate_scale: float = 1.0                  # >1 compresses inter-arrival times (more load)
    load: Optional[float] = None             # offered load, a fraction of the estimated capacity: sets
                                             # rate_scale before the run (policylab/apps/offered_load.py)
    repeat: int = 1                          # tile the trace N times (a longer steady state at high load)
    client_timeout: Optional[float] = None   # s: a request not finished this long after it arrived is
                                             # abandoned by its client (rejected, its KV freed); None: never
    replicate: int = 0                       # 0: the trace as read; K >= 1: K-th block-bootstrap resample
    max_requests: Optional[int] = None       # keep the first N requests (after window and sampling)
    start_time: Optional[float] = None       # time window [start_time, end_time) in trace seconds
    end_time: Optional[float] = None
    max_prompt_tokens: Optional[int] = None  # clip prompt lengths
    max_output_tokens: Optional[int] = None  # clip output lengths
    prefix_block_tokens: int = 512           # tokens covered by each id in prefix_hashes
    extra: dict = field(default_factory=dict)   # format-specific options (reader keywords)
    sessions: bool = False                   # replay the trace's conversations in closed loop (docs/sessions.md)
    concurrency: Optional[int] = None        # N closed-loop users, each sends when its last request finished
    sample_fraction: Optional[float] = None  # keep each request with this probability (seeded by the run seed)
    client_assignment: str = "keep"          # keep | column (client_column) | round_robin | zipf (num_clients)
    client_column: Optional[str] = None      # CSV column / JSON key naming the client (client_assignment=column)
    num_clients: int = 4                     # clients of round_robin / zipf assignment: client-0 ... client-N-1
    zipf_exponent: float = 1.0               # zipf: client-k is drawn with weight 1 / (k+1)^s
    slo_classes: dict = field(default_factory=lambda: {      # class -> SLOs (s); add: +trace.slo_classes.x=...
        "interactive": {"ttft_slo": 0.5, "tpot_slo": 0.05}, "batch": {"ttft_slo": 5.0, "tpot_slo": 0.5}})
    slo_by_client: dict = field(default_factory=dict)  # client -> class, e.g. +trace.slo_by_client={a: batch}
    slo_ratio: dict = field(default_factory=dict)      # class -> weight, each request draws one (seeded)
    tool_calls: dict = field(default_factory=dict)     # add tool calls (seeded; policylab.traces.tool_calls):
                                                       # {calls, duration_s, result_tokens, fraction, fixed_duration}
