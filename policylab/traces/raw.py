"""RawRequest: a request as a reader yields it, before transforms.

Same fields, order and defaults as policylab.request.TraceRequest, but a NamedTuple: about five
times cheaper to build than the frozen dataclass, which matters for million-row traces. The
transforms build each final TraceRequest once, as `TraceRequest(*raw)` with the changes applied.
"""
from __future__ import annotations

from typing import NamedTuple, Optional


class RawRequest(NamedTuple):
    arrival_time: float              # seconds, any origin (the transforms rebase)
    prompt_tokens: int
    output_tokens: int
    client: str = "default"
    priority: int = 0
    ttft_slo: Optional[float] = None
    tpot_slo: Optional[float] = None
    prefix_hashes: tuple = ()
    max_tokens: Optional[int] = None
