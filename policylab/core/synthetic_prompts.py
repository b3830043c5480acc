"""Deterministic synthetic prompt token ids for trace requests.

Lengths come from the trace; contents are pseudo-random ids derived from the
request's prefix hashes, so requests that share a prefix in the trace share identical
tokens (and therefore prefix-cache blocks), at any engine block size.

Each stream (a shared prefix segment, or a request's own tokens) is a window of one seeded
pool of ids, at an offset its key chooses; its first ids come from the key itself, so two
streams never begin alike, even at the same offset (and a block's prefix hash covers every
token before it, so streams that begin apart share no block). A window costs two numpy calls
instead of a hash per token: every request of a replay pays it on arrival.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from policylab.core.rng import hash_key, splitmix64

_RESERVED = 16   # keep clear of special-token ids at the bottom of a vocabulary
_POOL_TOKENS = 1 << 16     # a window wraps around it; chains differ from the first block anyway
_KEY_TOKENS = 4  # ids taken from a stream's 64-bit key: >= 32 bits of it even with a 256-id vocab


@lru_cache(maxsize=4)
def _pool(seed: int, vocab_size: int) -> np.ndarray:
    ids = splitmix64(hash_key("pool", seed), 0, _POOL_TOKENS) % np.uint64(vocab_size - _RESERVED)
    pool = (ids + np.uint64(_RESERVED)).astype(np.int32)
    pool.flags.writeable = False
    return pool


def _window(key: int, count: int, vocab_size: int, seed: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """Ids [lo, hi) of the `count`-id stream `key`: its own first ids, then the pool from a
    key-chosen offset."""
    hi = count if hi is None else hi
    offset = key % _POOL_TOKENS
    ids = _pool(seed, vocab_size).take(np.arange(offset + lo, offset + hi), mode="wrap")
    span = vocab_size - _RESERVED
    for k in range(lo, min(hi, _KEY_TOKENS)):
        ids[k - lo] = _RESERVED + (key >> 16 * k) % span
    return ids


def synthesize_prompt(index: int, prompt_tokens: int, prefix_hashes, vocab_size: int,
                      seed: int = 0, prefix_block_tokens: int = 512, start: int = 0,
                      stop: int | None = None) -> np.ndarray:
    """Prompt ids [start, stop) (all by default): one segment per prefix hash, then tokens unique
    to this request; only the segments that overlap the range are made."""
    stop = prompt_tokens if stop is None else min(stop, prompt_tokens)
    segments, pos = [], 0
    for h in prefix_hashes:
        if pos >= prompt_tokens:
            break
        n = min(prefix_block_tokens, prompt_tokens - pos)
        segments.append((hash_key("prefix", seed, h), pos, n))
        pos += n
    if pos < prompt_tokens:
        segments.append((hash_key("request", seed, index), pos, prompt_tokens - pos))
    parts = [_window(key, n, vocab_size, seed, max(start - at, 0), min(stop - at, n))
             for key, at, n in segments if at < stop and at + n > start]
    if not parts:
        return np.zeros(0, dtype=np.int32)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class SyntheticPrompt:
    """A synthesized prompt that is made again when read instead of held: 4 bytes a token
    (4.6 KB for a 1,150-token prompt) become ~100 bytes, which is what a waiting request
    costs when an overloaded million-request replay queues 100k+ of them. Only a data plane
    that never reads token ids gets it (the engine still hashes the ids once, on arrival)."""

    __slots__ = ("_args",)

    def __init__(self, index: int, prompt_tokens: int, prefix_hashes, vocab_size: int, seed: int,
                 prefix_block_tokens: int):
        self._args = (index, prompt_tokens, prefix_hashes, vocab_size, seed, prefix_block_tokens)

    def __len__(self) -> int:
        return self._args[1]

    def __getitem__(self, key):
        if isinstance(key, slice) and key.step is None:      # only the segments it covers
            start, stop, _ = key.indices(self._args[1])
            return synthesize_prompt(*self._args, start=start, stop=max(start, stop))
        return synthesize_prompt(*self._args)[key]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        ids = synthesize_prompt(*self._args)
        return ids if dtype is None else ids.astype(dtype)
