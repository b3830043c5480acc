"""RawRequest: a request as a reader yields it, before transforms.

A namedtuple built from policylab.core.request.TraceRequest's own fields (same names, order and
defaults; less `prompt_ids`, which only `generate` sets): about five times cheaper to build than
the frozen dataclass, which matters for million-row traces. Arrival times are in seconds from
any origin (the transforms rebase them). The transforms build each final TraceRequest once, as
`TraceRequest(*raw)` with the changes applied.
"""
from __future__ import annotations

from collections import namedtuple
from dataclasses import MISSING, fields

from policylab.core.request import TraceRequest

_FIELDS = [f for f in fields(TraceRequest) if f.name != "prompt_ids"]
RawRequest = namedtuple("RawRequest", [f.name for f in _FIELDS],
                        defaults=[f.default for f in _FIELDS if f.default is not MISSING])
