"""The prefix hashes of KV blocks (DESIGN §4's chained hash): one key per full block, of every
token up to its end, so identical prefixes share physical blocks; and the keys of a prompt of
its own, which can never match another request's."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from policylab.core.rng import hash_key, splitmix64


def chain_hashes(token_ids: np.ndarray, block_size: int, prev: int | None = None, start: int = 0) -> list:
    """Prefix hashes of the full blocks of `token_ids`, positions start, start+1, ... of a sequence
    whose first `start` tokens hash to `prev`: block k's hash stands for every token up to its end.

    The hash is universal over the prefix: the sum of (id + 1) * W[position] mod 2^64, with
    fixed pseudo-random 64-bit weights W. Two different prefixes (ids below 2^17) get the same
    hash with probability under 2^-47. It is one cumulative sum over the tokens, read at each
    block's end, not a hash call per block: every prompt pays it on arrival.
    """
    end = start + len(token_ids) // block_size * block_size
    terms = np.array(token_ids[:end - start], np.uint64)       # a fresh array, updated in place
    terms += np.uint64(1)                                        # so that no id adds nothing
    terms *= _weights(end)[start:end]
    hashes = terms.cumsum(out=terms)[block_size - 1::block_size]  # the running sum at each block's end
    if prev is not None:
        hashes += np.uint64(prev)
    return hashes.tolist()


_WEIGHTS = np.empty(0, np.uint64)


def own_block_keys(seed: int, index: int, start: int, stop: int) -> range:
    """Prefix-cache keys of blocks [start, stop) of request `index` whose prompt is its own
    (`TraceRequest.own_prompt`: synthesized, no prefix shared in the trace).

    No other request can share a block of such a prompt (its first ids come from its own key),
    so its chained hashes only ever match its own blocks, after a preemption. A key unique to
    (request, block) gives the cache exactly those hits without reading a token (the sim plane
    keeps no prompt ids, and hashing them is a real part of a large replay), and the engine makes
    the keys only when the request is preempted: until then no request could hit its blocks,
    and once it finishes none ever can (`BlockPool.release(table, unhittable)`). Keys are a 63-bit
    mix of (seed, request) plus the block's index: spread over the hash table like hashes, and
    as unlikely to meet another request's keys or a chained hash as two chained hashes are to
    meet each other.
    """
    base = _mix64(_own_key_offset(seed) ^ index) >> 1
    return range(base + start, base + stop)


@lru_cache(maxsize=8)
def _own_key_offset(seed: int) -> int:
    return hash_key("own blocks", seed)


def _mix64(x: int) -> int:
    """splitmix64's finalizer on a Python int (one request's key base: no numpy call)."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def _weights(size: int) -> np.ndarray:
    """Position weights of the prefix hash, grown (doubling) to cover `size` positions."""
    global _WEIGHTS
    if len(_WEIGHTS) < size:
        have = len(_WEIGHTS)
        _WEIGHTS = np.concatenate([_WEIGHTS, splitmix64(0x5EED, have, max(size, 2 * have, 8192) - have)])
    return _WEIGHTS
