"""What a plan costs in blocks, before the pool commits anything (DESIGN §4): the blocks a chunk
takes beyond its table or its cache hits, and a whole plan's blocks needed against those available
once its preemptions have released their tables. Pure arithmetic over the pool's reference counts,
asked by the plan checks and the views; `BlockPool` does the taking.
"""
from __future__ import annotations

from collections import Counter


def new_blocks(r, n: int, hits: tuple, block_size: int) -> int:
    """Blocks beyond its table (running) or its cache hits `hits` (waiting) that giving `n` more
    tokens to request `r` takes."""
    table = r.block_table
    if table:                            # (blocks_for, inline: called for every chunk of every plan)
        need = -(-(r.num_computed_tokens + n) // block_size) - len(table)
    else:
        computed, hit = r.num_computed_tokens, len(hits) * block_size
        need = -(-((computed if computed > hit else hit) + n) // block_size) - len(hits)
    return need if need > 0 else 0


_NONE_RELEASED = Counter()       # (plan_cost without preemptions: never changed)


def plan_cost(ref, num_free: int, block_size: int, hits, preempted: list, chunks) -> tuple:
    """(blocks needed, blocks available) of giving `chunks` ((request, tokens) pairs) their tokens
    once the `preempted` requests have released their tables, over reference counts `ref` (block
    id -> count) and a prefix-cache lookup `hits` (request -> cached block ids). A block is
    available when every reference to it is a preempted one; a cache hit on a block that nobody
    holds after the preemptions takes a free block, counted once however many requests hit it."""
    released = Counter() if preempted else _NONE_RELEASED
    for r in preempted:
        released.update(r.block_table)
    available = num_free + sum(1 for b, k in released.items() if ref[b] == k) if preempted else num_free
    needed, reclaimed = 0, set()
    for r, n in chunks:
        cached = () if r.block_table else hits(r)
        needed += new_blocks(r, n, cached, block_size)
        if cached:
            reclaimed.update(b for b in cached if ref[b] == released[b])
    return needed + len(reclaimed), available
