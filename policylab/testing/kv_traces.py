"""Traces that exercise the KV hierarchy: shared prefixes in Mooncake's shape, and a stream that
starves a request with no prefix hits under a cache-aware order."""
from __future__ import annotations

import random

from policylab.core.request import TraceRequest


def mooncake_style(n: int, seed: int, rate: float = 40.0, segment: int = 32, groups: int = 5,
                   max_depth: int = 6, output: tuple = (2, 20)) -> tuple:
    """Mooncake-shaped requests: conversations whose turns extend a shared chain of hash ids (one
    system prompt for all, then a conversation's history), each id standing for `segment` tokens
    (replay with prefix_block_tokens=segment), the last block partial, half with a private tail.
    Poisson arrivals at `rate` requests/s."""
    rng, t, trace = random.Random(seed), 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        group, depth = rng.randrange(groups), rng.randint(1, max_depth)
        ids = (0,) + tuple(100 * (group + 1) + k for k in range(depth))
        if rng.random() < 0.5:
            ids += (1_000_000 + i,)
        trace.append(TraceRequest(arrival_time=t, prompt_tokens=len(ids) * segment - rng.randrange(segment // 2),
                                  output_tokens=rng.randint(*output), prefix_hashes=ids))
    return tuple(trace)


def hit_stream(n: int, segment: int = 32, gap: float = 0.002) -> tuple:
    """One request with no shared prefix first, then `n` requests sharing a long prefix, arriving
    faster than they are served: longest-prefix-match without aging serves the stream first."""
    trace = [TraceRequest(arrival_time=0.0, prompt_tokens=4 * segment, output_tokens=4, prefix_hashes=(7, 8, 9, 10)),
             TraceRequest(arrival_time=0.0005, prompt_tokens=4 * segment, output_tokens=4)]
    trace += [TraceRequest(arrival_time=0.001 + gap * i, prompt_tokens=4 * segment + 8, output_tokens=4,
                           prefix_hashes=(7, 8, 9, 10, 50_000 + i)) for i in range(n)]
    return tuple(trace)
