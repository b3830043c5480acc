"""Typed trace selection and transforms (the `trace` config group)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class TraceConfig:
    name: str = "bursty"
    path: str = "traces/bursty.jsonl"        # relative: to the cwd, else to the project root
    format: str = "auto"                     # auto | native | azure | mooncake | burstgpt | vidur | parquet
    rate_scale: float = 1.0                  # >1 compresses inter-arrival times (more load)
    max_requests: Optional[int] = None
    start_time: Optional[float] = None       # time window [start_time, end_time) in trace seconds
    end_time: Optional[float] = None
    max_prompt_tokens: Optional[int] = None  # clip prompt lengths
    max_output_tokens: Optional[int] = None  # clip output lengths
    prefix_block_tokens: int = 512           # tokens covered by each id in prefix_hashes
    extra: dict = field(default_factory=dict)   # format-specific options (reader keywords)
