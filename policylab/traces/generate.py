"""Seeded synthetic traces: one or more clients, each with its own arrival process, length
distributions, SLO class and (optionally) a pool of shared system prompts.

Shared prompts become `prefix_hashes`: a request that uses system prompt k of its client gets
the same block ids as every other user of k, so a replay exercises the prefix cache.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from policylab.core.request import TraceRequest
from policylab.traces.arrivals import ArrivalProcess
from policylab.traces.lengths import LengthDist

TIME_DECIMALS = 6   # arrival times are written to the microsecond


@dataclass(frozen=True)
class PrefixPool:
    """`size` system prompts of `blocks` blocks each; a share of requests starts with one."""
    size: int = 4
    blocks: int = 2                 # blocks per system prompt (each of prefix_block_tokens tokens)
    share: float = 0.8              # probability that a request uses a system prompt (uniform pick)
    block_tokens: int = 64          # must equal the replay's trace.prefix_block_tokens

    def __post_init__(self):
        if self.size < 1 or self.blocks < 1 or self.block_tokens < 1 or not 0 <= self.share <= 1:
            raise ValueError(f"prefix pool needs size, blocks, block_tokens >= 1 and 0 <= share <= 1, got {self}")


@dataclass(frozen=True)
class ClientSpec:
    name: str = "default"
    arrivals: ArrivalProcess = field(default_factory=ArrivalProcess)
    prompt_len: LengthDist = field(default_factory=lambda: LengthDist("lognormal", mean=256, at=512))
    output_len: LengthDist = field(default_factory=lambda: LengthDist("lognormal", mean=64, at=128))
    ttft_slo: Optional[float] = None
    tpot_slo: Optional[float] = None
    priority: int = 0
    prefix: Optional[PrefixPool] = None


def _prefixes(rng: np.random.Generator, pool: Optional[PrefixPool], prompts: np.ndarray,
              first_id: int) -> list:
    """Per request: the block ids of its system prompt (only blocks the prompt fully covers)."""
    if pool is None:
        return [()] * len(prompts)
    uses = rng.random(len(prompts)) < pool.share
    picks = rng.integers(0, pool.size, size=len(prompts))
    out = []
    for used, k, n_tokens in zip(uses, picks, prompts):
        blocks = min(pool.blocks, int(n_tokens) // pool.block_tokens) if used else 0
        base = first_id + int(k) * pool.blocks
        out.append(tuple(range(base, base + blocks)))
    return out


def generate_trace(clients: Sequence[ClientSpec], num_requests: int, seed: int = 0) -> list:
    """`num_requests` requests merged from all clients in arrival order, the first at 0.0 s.

    Each client draws from its own child of SeedSequence(seed), so adding a client does not
    change the others' streams. Each draws `num_requests` arrivals; the merge keeps the earliest.
    """
    if num_requests < 1 or not clients:
        raise ValueError(f"need num_requests >= 1 and at least one client, got {num_requests}, {len(clients)}")
    names = [c.name for c in clients]
    if len(set(names)) != len(names):
        raise ValueError(f"client names must be unique, got {names}")
    rows, first_id = [], 0
    for index, (client, child) in enumerate(zip(clients, np.random.SeedSequence(seed).spawn(len(clients)))):
        rng = np.random.default_rng(child)
        times = client.arrivals.sample(rng, num_requests)
        prompts = client.prompt_len.sample(rng, num_requests)
        outputs = client.output_len.sample(rng, num_requests)
        prefixes = _prefixes(rng, client.prefix, prompts, first_id)
        if client.prefix is not None:
            first_id += client.prefix.size * client.prefix.blocks
        rows += [(float(t), index, i, int(p), int(o), h)
                 for i, (t, p, o, h) in enumerate(zip(times, prompts, outputs, prefixes))]
    rows.sort(key=lambda row: row[:3])
    rows = rows[:num_requests]
    start = rows[0][0]
    return [TraceRequest(round(t - start, TIME_DECIMALS), p, o, clients[c].name, clients[c].priority,
                         clients[c].ttft_slo, clients[c].tpot_slo, h)
            for t, c, _, p, o, h in rows]


def multitenant_clients(num_clients: int, rate: float, flood_factor: float = 4.0,
                        slo_classes: Sequence[tuple] = (), names: Sequence[str] = (),
                        cv: float = 1.0, prompt_len: LengthDist = ClientSpec().prompt_len,
                        output_len: LengthDist = ClientSpec().output_len,
                        prefix: Optional[PrefixPool] = None) -> list:
    """`num_clients` clients at `rate` req/s each, except the first, the *flooder*, at
    flood_factor × rate (flood_factor=1: no flooder). `slo_classes` — (name, ttft, tpot)
    tuples — are dealt round-robin over the clients."""
    if num_clients < 1 or flood_factor <= 0:
        raise ValueError(f"need num_clients >= 1 and flood_factor > 0, got {num_clients}, {flood_factor}")
    if names and len(names) != num_clients:
        raise ValueError(f"{len(names)} client names given for {num_clients} clients")
    default = ["flooder" if flood_factor != 1 else "client-0"] + [f"client-{i}" for i in range(1, num_clients)]
    out = []
    for i, name in enumerate(names or default):
        ttft, tpot = slo_classes[i % len(slo_classes)][1:] if slo_classes else (None, None)
        kind = "poisson" if cv == 1 else "gamma"
        arrivals = ArrivalProcess(kind, rate=rate * (flood_factor if i == 0 else 1.0), cv=cv)
        out.append(ClientSpec(name, arrivals, prompt_len, output_len, ttft, tpot, prefix=prefix))
    return out
