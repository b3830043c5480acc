"""Seeded synthetic chat sessions: session starts from an arrival process, a geometric number
of turns, exponential think times, and length distributions for the first prompt, each
follow-up and each answer. A pool of shared system prompts (optional) gives a share of the
sessions the same first blocks, so sessions also share a prefix with each other.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from policylab.traces.arrivals import ArrivalProcess
from policylab.traces.fields import MAX_SECONDS
from policylab.traces.generate import TIME_DECIMALS, PrefixPool
from policylab.traces.lengths import LengthDist
from policylab.traces.sessions import Session, Turn


@dataclass(frozen=True)
class SessionSpec:
    starts: ArrivalProcess = field(default_factory=lambda: ArrivalProcess("poisson", rate=1.0))
    mean_turns: float = 4.0          # geometric number of turns (>= 1) with this mean
    max_turns: int = 32
    think_time: float = 5.0          # mean of the exponential think time, s (0: none)
    first_prompt: LengthDist = field(default_factory=lambda: LengthDist("lognormal", mean=256, at=512))
    follow_up: LengthDist = field(default_factory=lambda: LengthDist("lognormal", mean=64, at=128))
    output_len: LengthDist = field(default_factory=lambda: LengthDist("lognormal", mean=128, at=256))
    prefix: Optional[PrefixPool] = None
    client: Optional[str] = None     # None: each session is its own client

    def __post_init__(self):
        if not 1 <= self.mean_turns <= self.max_turns:
            raise ValueError(f"sessions need 1 <= mean_turns <= max_turns, got {self.mean_turns}, {self.max_turns}")
        if not 0 <= self.think_time <= MAX_SECONDS:
            raise ValueError(f"think_time must be a finite mean >= 0 s (at most {MAX_SECONDS:.0e}), got {self.think_time}")


def generate_sessions(spec: SessionSpec, num_sessions: int, seed: int = 0) -> list:
    """`num_sessions` sessions, the first starting at 0.0 s; same spec and seed: same sessions."""
    if num_sessions < 1:
        raise ValueError(f"need num_sessions >= 1, got {num_sessions}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 7]))
    starts = spec.starts.sample(rng, num_sessions)
    turns = np.minimum(rng.geometric(1.0 / spec.mean_turns, size=num_sessions), spec.max_turns)
    total = int(turns.sum())
    follow, outputs = spec.follow_up.sample(rng, total), spec.output_len.sample(rng, total)
    firsts = spec.first_prompt.sample(rng, num_sessions)
    thinks = rng.exponential(spec.think_time, size=total) if spec.think_time > 0 else np.zeros(total)
    uses = rng.random(num_sessions) < (spec.prefix.share if spec.prefix else 0.0)
    picks = rng.integers(0, spec.prefix.size if spec.prefix else 1, size=num_sessions)
    out, at = [], 0
    for s in range(num_sessions):
        n = int(turns[s])
        hashes = ()
        if spec.prefix and uses[s]:
            blocks = min(spec.prefix.blocks, int(firsts[s]) // spec.prefix.block_tokens)
            hashes = tuple(range(int(picks[s]) * spec.prefix.blocks, int(picks[s]) * spec.prefix.blocks + blocks))
        session_turns = tuple(Turn(int(firsts[s]) if k == 0 else int(follow[at + k]), int(outputs[at + k]),
                                   0.0 if k == 0 else round(float(thinks[at + k]), TIME_DECIMALS), spec.client)
                              for k in range(n))
        out.append(Session(f"session-{s}", round(float(starts[s] - starts[0]), TIME_DECIMALS), session_turns, hashes))
        at += n
    return out
