"""`trace.replicate=K`: the K-th resample of a trace, so runs have replicates (DESIGN §8 determinism).

A sim replay of a trace file is deterministic, so `seed=0,1,2` alone repeats one measurement.
Replicate 0 is the trace as read; replicate K ≥ 1 is a moving-block bootstrap of it, drawn
from `(seed, K)`: blocks of `BLOCK` consecutive requests, each starting at a uniformly drawn
position, are concatenated until the trace has its original number of requests. A request
keeps its lengths, client, priority, SLOs, prefix hashes and the gap to its predecessor in
the original (a block's first request keeps its own gap too), and arrival times are the
running sum of those gaps. So what varies is which requests arrive and in which order;
what is kept is the request count, the mix of lengths, clients and SLO classes, the mean rate
and the burst structure within a block. It applies to recorded and generated traces alike.

`trace.repeat=N` (applied just before) tiles the trace N times, each copy starting one mean
gap after the previous one ends: a longer replay of the same workload, so a high load is
measured in its steady state rather than in a transient of a few seconds.
"""
from __future__ import annotations

import os

import numpy as np

BLOCK = 32          # requests per bootstrap block: long enough to keep a burst together


def tile(reqs: list, times: list, repeat: int) -> tuple[list, list]:
    """`reqs` and `times` `repeat` times over, each copy after the previous one plus one mean gap."""
    if repeat == 1 or not reqs:
        return reqs, times
    span = times[-1] - times[0]
    period = span + (span / (len(times) - 1) if len(times) > 1 else 1.0)
    return reqs * repeat, [t + k * period for k in range(repeat) for t in times]


def resample(reqs: list, times: list, replicate: int, seed: int) -> tuple[list, list]:
    """`reqs` with their relative arrival `times` (sorted), resampled as replicate `replicate`."""
    n = len(reqs)
    if replicate == 0 or n < 2:
        return reqs, times
    gaps = np.diff(np.asarray(times, dtype=float), prepend=times[0])
    gaps[0] = gaps[1:].mean()                # the first request's gap: the mean one
    block = min(BLOCK, n)
    rng = np.random.default_rng([seed, 4, replicate])
    starts = rng.integers(0, n - block + 1, size=-(-n // block))
    picks = np.concatenate([np.arange(s, s + block) for s in starts])[:n]
    new_times = np.cumsum(gaps[picks]) - gaps[picks[0]]
    return [reqs[i] for i in picks], new_times.tolist()


def physical_memory() -> int:
    """Bytes of RAM on this machine (0 where the platform does not say): the bound a tiling or a
    KV cache is refused against before the run."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0
