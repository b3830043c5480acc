"""Copy-on-write: the KV manager's strategy for blocks that forks share (DESIGN §4's paging, shared).

Parallel samples and beams hold references on one prompt's blocks (`KVManager.fork`). Shared
blocks are counted once (the pool counts a block with any reference as one used block), and no
block is written while it is shared: a step that writes into a block with more than one
reference first gives the writer a copy of it (vLLM v0's `BlockSpaceManager.fork` and
`append_slots`). The last holder writes in place, so of W writers of a block held R times,
min(W, R - 1) copy: the validator charges exactly that and `blocks_needed` one block for each
writer of a shared block.
"""
from __future__ import annotations

from collections import Counter

from policylab.core.kv.blocks import blocks_for


class SharedWrites:
    """Which blocks a write of tokens lands in that another request holds too, how many copies a
    set of writes takes, and the copies themselves."""

    def __init__(self, ref: list, block_size: int):
        self._ref, self.block_size = ref, block_size
        self.copies_made = 0

    def shared_blocks(self, r, n: int) -> list:
        """Indices in `r.block_table` of the existing blocks that computing `n` more tokens of `r`
        writes and that another table holds too."""
        table, bs, ref = r.block_table, self.block_size, self._ref
        start, stop = r.num_computed_tokens // bs, min(len(table), blocks_for(r.num_computed_tokens + n, bs))
        return [i for i in range(start, stop) if ref[table[i]] > 1]

    def blocks_for_write(self, r, n: int) -> int:
        """Copies giving running request `r` `n` more tokens takes if it writes before the other holders."""
        return len(self.shared_blocks(r, n))

    def copies(self, writes, preempted=()) -> int:
        """Blocks the copies of `writes` ((request, tokens) pairs of one step) take once the
        `preempted` requests have released their tables: min(writers, holders left - 1) per block."""
        writers = Counter()
        for r, n in writes:
            if r.block_table:
                table = r.block_table
                writers.update(table[i] for i in self.shared_blocks(r, n))
        if not writers:
            return 0
        released = Counter()
        for r in preempted:
            released.update(b for b in r.block_table if b in writers)
        ref = self._ref
        return sum(max(0, min(w, ref[b] - released[b] - 1)) for b, w in writers.items())

    def copy_on_write(self, pool, plane, writes) -> None:
        """Give each writer ((request, tokens) pairs, in plan order) of a shared block its own copy
        first, the K/V copied on a plane that holds it; the last holder keeps the block."""
        src, dst = [], []
        for r, n in writes:
            if not r.block_table:
                continue
            for i in self.shared_blocks(r, n):
                old = r.block_table[i]
                r.block_table[i] = new = pool.copy_block(old)
                src.append(old)
                dst.append(new)
        if src:
            self.copies_made += len(src)
            plane.copy(src, dst)
