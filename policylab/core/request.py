"""Engine-side request state.

The engine owns and mutates `Request`; policies only ever see it through
`policylab.core.contract.RequestView`. The true output length of a trace request is
deliberately *not* stored here: the engine keeps it apart so no policy can read it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

import numpy as np


class Status(str, enum.Enum):
    PENDING = "pending"      # in the trace, not yet arrived
    WAITING = "waiting"
    RUNNING = "running"
    PAUSED = "paused"        # waiting for a tool call to return (policylab.core.extensions.tool_calls)
    FINISHED = "finished"
    REJECTED = "rejected"


# its members as module names, for the engine's loops: on Python 3.11 a name looked up on an Enum
# class goes through `EnumType.__getattr__`, several times what a module name costs
WAITING, RUNNING, FINISHED, REJECTED = Status.WAITING, Status.RUNNING, Status.FINISHED, Status.REJECTED
_DONE = (FINISHED, REJECTED)

MAX_ARRIVAL_S = 1e9      # 31 years: beyond it float64 seconds lose sub-microsecond precision (at 1e17
                         # every latency is 0.0), so traces must be rebased (DESIGN §9 readers do)
MAX_TOKENS = 10**12      # token counts past it are refused by the readers (int64 columns overflow)
NO_TOKENS = np.zeros(0, dtype=np.int32)   # the prompt of a request rejected on arrival


def check_arrivals(trace: list) -> None:
    """A trace sorted by arrival must start at >= 0 s and end within MAX_ARRIVAL_S."""
    if trace and not (0.0 <= trace[0].arrival_time and trace[-1].arrival_time <= MAX_ARRIVAL_S):
        bad = trace[0] if not 0.0 <= trace[0].arrival_time else trace[-1]
        raise ValueError(f"trace: arrival_time {bad.arrival_time!r} s is outside [0, {MAX_ARRIVAL_S:g}] s "
                         "(arrivals are seconds from the trace's start)")


@dataclass(frozen=True)
class TraceRequest:
    """One request of an arrival trace (native format, DESIGN §9)."""

    arrival_time: float
    prompt_tokens: int
    output_tokens: int
    client: str = "default"
    priority: int = 0
    ttft_slo: Optional[float] = None
    tpot_slo: Optional[float] = None
    prefix_hashes: tuple = ()
    max_tokens: Optional[int] = None
    spec_acceptance: Optional[float] = None   # per-draft acceptance rate on the sim (None: speculative.acceptance_rate)
    n: int = 1                            # parallel samples (copy-on-write forks of one prompt)
    fork_output_tokens: tuple = ()        # output lengths of samples 1..n-1 (empty: output_tokens each)
    beam_width: int = 1                   # beams of a (simple, stochastic) beam search over forks
    tool_calls: tuple = ()                # ToolCalls (policylab.core.extensions.tool_calls), by after_tokens
    prompt_ids: Optional[tuple] = None    # real token ids (generate); None: synthesized from the trace

    @property
    def tool_tokens(self) -> int:
        """Tokens the tools return into this request's context, all calls together."""
        return sum(c.result_tokens for c in self.tool_calls)

    @property
    def own_prompt(self) -> bool:
        """Synthesized and sharing no prefix: no other request can hold one of its KV blocks."""
        return self.prompt_ids is None and not self.prefix_hashes


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling; greedy when temperature == 0."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


@dataclass(eq=False, slots=True)
class Request:
    req_id: int
    arrival_time: float
    prompt_ids: np.ndarray            # int32 token ids of the prompt (or a SyntheticPrompt: made when read)
    max_tokens: int                   # declared cap, visible to policies
    client: str = "default"
    priority: int = 0
    ttft_slo: Optional[float] = None
    tpot_slo: Optional[float] = None
    predicted_output_tokens: Optional[int] = None
    sampling: SamplingParams = SamplingParams()
    status: Status = Status.WAITING
    output_ids: list = field(default_factory=list)
    num_computed_tokens: int = 0      # tokens whose KV is in the cache
    block_table: list = field(default_factory=list)
    block_hashes: list = field(default_factory=list)   # chained hashes of full blocks, prefix order
                                                       # (the engine's: an array("Q"), 8 bytes each)
    own_prompt: bool = False          # its blocks are keyed by kv.own_block_keys, not hashed
    # timestamps (seconds on the replay clock)
    first_scheduled_time: Optional[float] = None
    token_times: list = field(default_factory=list)
    finish_time: Optional[float] = None
    num_preemptions: int = 0
    num_cached_tokens_total: int = 0  # prefix-cache hit tokens over the request's life
    swapped_blocks: int = 0           # waiting with this many KV blocks on the host tier (swap)
    reject_reason: str = ""
    fork_of: Optional[int] = None     # a parallel sample: the req_id of the trace request it samples for
    forks: Optional[list] = None      # a trace request with parallel samples: its other samples' Requests
    # on a decode batch that defers its tokens: what settles them (policylab.core.decode_batch)
    deferred: Optional[object] = field(default=None, init=False, repr=False)
    # len(prompt_ids), kept: read for every entry of every step, and a synthesized prompt's length
    # is a Python call (a prompt is never replaced)
    prompt_len: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        self.prompt_len = len(self.prompt_ids)

    @property
    def trace_id(self) -> int:
        """The trace request this one serves: its own, or the one a fork samples for."""
        return self.req_id if self.fork_of is None else self.fork_of

    @property
    def num_tokens(self) -> int:
        """Known tokens: prompt plus every sampled output token."""
        return self.prompt_len + len(self.output_ids)

    def token_ids(self, start: int, end: int) -> np.ndarray:
        """Token ids in [start, end) of prompt + outputs, as int32."""
        p = self.prompt_len
        if end <= p:
            return self.prompt_ids[start:end]
        out = np.asarray(self.output_ids[max(start - p, 0):end - p], dtype=np.int32)
        if start >= p:
            return out
        return np.concatenate([self.prompt_ids[start:], out])


def is_decoding(r: Request) -> bool:
    """The one test of "this request decodes": it has output tokens and every known token but the
    last is in the KV cache, so its next step computes exactly one token (a recompute one token
    short of the end decodes too)."""
    out = r.output_ids
    return bool(out) and r.prompt_len + len(out) - r.num_computed_tokens == 1


def forget_done(requests: list, start: int, stop: int) -> None:
    """Drop the finished and rejected requests in `requests[start:stop]` (set them to None): a
    results writer has taken them, so memory grows with the requests in flight, not the run."""
    for i in range(start, stop):
        r = requests[i]
        if r is not None and r.status in _DONE:
            requests[i] = None
