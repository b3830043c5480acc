"""Counter-based pseudo-random 64-bit streams (splitmix64 of the positions).

Value i of stream `key` depends on (key, i) only, so callers can grow, slice or cache a
stream in any order and still get the same numbers: determinism without keeping a
generator's state. Used for synthetic prompt ids, the sim plane's sampled ids and the
prefix-hash weights. `hash_key` turns names and numbers into a stream's key.
"""
from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SHIFTS = tuple(np.uint64(k) for k in (30, 27, 31))
_MULTS = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def splitmix64(key: int, start: int, count: int) -> np.ndarray:
    """Values start .. start+count-1 of stream `key`, as uint64 (computed in place; arrays wrap)."""
    x = np.arange(start, start + count, dtype=np.uint64)
    x *= _GOLDEN
    x += np.uint64(key % 2 ** 64)
    x ^= x >> _SHIFTS[0]
    x *= _MULTS[0]
    x ^= x >> _SHIFTS[1]
    x *= _MULTS[1]
    x ^= x >> _SHIFTS[2]
    return x


def hash_key(*parts) -> int:
    """Stable 64-bit key from ints/strings (Python's hash() is salted for strings)."""
    h = 1469598103934665603
    for p in parts:
        for byte in str(p).encode():
            h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        h = ((h ^ 0xFF) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h
