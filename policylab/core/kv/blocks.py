"""The block pool under the KV manager: blocks as pages, block tables as page tables (DESIGN §4).

Full blocks carry a prefix hash (of every token up to the block's end, DESIGN §4's chained
hash) so identical prefixes share physical blocks. Freed blocks keep their hash and sit in an
LRU list until reused, so a later request (or a preempted one coming back) can hit them.
Invariant: free + used == total, and at drain every reference count is 0.
"""
from __future__ import annotations

from collections import deque
from itertools import chain, repeat
from operator import itemgetter
from types import MappingProxyType

from policylab.core.kv.radix import RadixTree


_drain = deque(maxlen=0).extend     # runs an iterator to its end at C level (`grow_each`)


def _all_are(table: list, values: list, value) -> bool:
    """Every block of `table` has `value` in `values` (a per-block list), at C level."""
    return itemgetter(*table)(values).count(value) == len(table)


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks that hold `num_tokens` tokens: the one block-count formula (a ceiling division)."""
    return -(-num_tokens // block_size)


class BlockPool:
    """Reference counts, the free lists, the prefix index and the LRU of free cached blocks. Request-level
    operations and the strategies above the pool (swap, tiers, copy-on-write) are `KVManager`'s.

    Blocks move in bulk: a request takes tens of blocks at once, sliced off the free list. A finished
    prompt of its own frees blocks nobody can ever hit (`release(..., unhittable)`): they enter the
    LRU as one entry, a run (a reversed list, taken off its end) as blocks are needed, where hashed
    blocks enter one by one (a hit takes a hashed block out of the middle of the LRU).

    A free block without a hash (on the plain list or in a run) keeps the count 1 of the table
    that last held it (or of the pool, before any did): only an allocation takes it (`_take`,
    `grow_one`), handing it on with that count, so a table's blocks move to the free lists and
    back by the slice with no write per block. `refs` reports such a block as 0. A free hashed
    block counts 0, as a hit (`acquire`) tells it apart by that."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 index: str = "hash"):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        if index not in ("hash", "radix"):
            raise ValueError(f"prefix cache index must be 'hash' or 'radix', got {index!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.prefix_caching = enable_prefix_caching
        self._tree = RadixTree() if index == "radix" and enable_prefix_caching else None   # leaf-LRU
        self._ref = [1] * num_blocks             # (1 for a free block without a hash: see above)
        self._block_hash: list = [None] * num_blocks
        self._cached: dict = {}                  # hash -> block id
        self._plain = list(range(num_blocks))    # free, no reusable content: a FIFO from _plain_head on
        self._plain_head = 0
        # Free cached blocks, least recently freed first: a hashed block's id, or a list (a run of
        # blocks nobody can hit, kept in reverse: the next one taken is popped off its end). A cache hit takes a hashed block out of the middle: its entry
        # stays and is skipped later (`_stale`), so freeing and reusing touch only the deque's ends.
        self._free_cached: deque = deque()
        self._stale = [0] * num_blocks           # per block: its older entries in free_cached
        self._num_free_cached = 0
        self._hits: dict = {}                    # req_id -> its cache hits, until the cache changes
        self._acquired = False                   # some block was acquired: until then every count is 1
        self._tiers = None                       # host/disk tiers below the cache (KVManager's strategy)

    @property
    def num_free(self) -> int:
        return len(self._plain) - self._plain_head + self._num_free_cached

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free    # (every step)

    def lookup(self, hashes: list, max_blocks: int) -> tuple:
        """Longest run of cached blocks matching the chain `hashes` (at most max_blocks)."""
        if not self.prefix_caching:
            return ()
        if self._tree is not None:
            return self._tree.lookup(hashes, max_blocks)
        hit = []
        cached = self._cached
        for h in hashes[:max_blocks]:
            b = cached.get(h)
            if b is None:
                break
            hit.append(b)
        return tuple(hit)

    def reclaim_cost(self, blocks) -> int:
        """How many free blocks taking `blocks` (cache hits) consumes: those nobody holds."""
        ref = self._ref
        return sum(1 for b in blocks if ref[b] == 0)

    # ------------------------------------------------------------------ read-only state for checks
    @property
    def refs(self) -> tuple:
        """Every block's reference count, by block id (0 for every free block)."""
        ref = list(self._ref)
        free = self._free_unhashed()
        _drain(map(ref.__setitem__, free, repeat(0, len(free))))
        return tuple(ref)

    def _free_unhashed(self) -> list:
        """The free blocks without a hash: the plain list's, then the runs'."""
        free = self._plain[self._plain_head:]
        for entry in self._free_cached:
            if type(entry) is list:
                free += entry
        return free

    @property
    def cache_map(self):
        """The prefix cache, hash -> block id (read-only)."""
        return MappingProxyType(self._cached)

    def holds(self, b: int) -> bool:
        """Whether some block table holds block `b`."""
        return self.refs[b] > 0

    def acquire(self, table: list, blocks) -> None:
        """Append cache-hit blocks to a block table, taking a reference on each."""
        if self._tiers is not None:               # lower-tier hits wait for tiers.promote_pending
            blocks = self._tiers.defer(table, blocks)
        self._acquired = True
        ref = self._ref
        for b in blocks:
            if ref[b] == 0:                      # free: its entry in free_cached goes stale
                self._stale[b] += 1
                self._num_free_cached -= 1
            ref[b] += 1
            table.append(b)
        if len(self._free_cached) > 2 * self.num_blocks:     # mostly stale entries: drop them
            self._free_cached = deque(self._live_entries())
            self._stale = [0] * self.num_blocks

    def grow(self, table: list, num_tokens: int) -> None:
        """Allocate blocks so `table` covers num_tokens tokens."""
        self._take(table, blocks_for(num_tokens, self.block_size) - len(table))

    def grow_one(self, table: list) -> None:
        """One more block for a table whose last block is full (a decode crossing a block boundary)."""
        head = self._plain_head
        if head < len(self._plain):
            b = self._plain[head]
            self._plain_head = head + 1
            table.append(b)
            if head > 4096 and 2 * head > len(self._plain):   # (the consumed front, dropped now and then)
                del self._plain[:head + 1]
                self._plain_head = 0
        elif self._num_free_cached:
            lru = self._free_cached
            run = lru[0] if self._tree is None else None
            if type(run) is list:                     # (a run of unhittable blocks: its last is next)
                b = run.pop()
                if not run:
                    lru.popleft()
                self._num_free_cached -= 1
                table.append(b)
            else:
                self._take(table, 1)
        else:
            raise MemoryError("KV cache exhausted: need 1 block, 0 free")

    def grow_each(self, tables: list) -> None:
        """One more block for each of `tables` (decodes crossing a block boundary together): the
        blocks `grow_one` would give them one after the other, taken in one pass."""
        if len(tables) == 1:
            return self.grow_one(tables[0])
        blocks = []
        self._take(blocks, len(tables))           # (plain blocks, then runs by the slice: `_take`'s order)
        _drain(map(list.append, tables, blocks))

    def copy_block(self, b: int) -> int:
        """A fresh block to copy shared block `b` into (copy-on-write): one reference on `b` moves
        to it."""
        if self._ref[b] < 2:
            raise ValueError(f"block {b} is not shared (reference count {self._ref[b]}): nothing to copy")
        if not self.num_free:
            raise MemoryError("KV cache exhausted: need 1 block for a copy-on-write, 0 free")
        new = []
        self._take(new, 1)
        self._ref[b] -= 1
        return new[0]

    def _take(self, table: list, need: int) -> None:
        """Plain free blocks first, then the least recently freed cached ones (evicting their
        hashes). Every block a request ever holds passes here and through release(). Fewer than
        `need` free: MemoryError, and nothing taken."""
        plain, head = self._plain, self._plain_head
        k = len(plain) - head
        if k >= need:
            k = need
        elif need - k > self._num_free_cached:
            raise MemoryError(f"KV cache exhausted: need {need} blocks, {k + self._num_free_cached} free")
        if k:
            taken = plain[head:head + k]
            head += k
            if head > 4096 and 2 * head > len(plain):          # (the consumed front, dropped now and then)
                del plain[:head]
                head = 0
            self._plain_head = head
            table += taken
        if need > k:
            self._num_free_cached -= need - k
            self._take_cached(table, need - k)

    def _take_cached(self, table: list, need: int) -> None:
        """`need` blocks off the front of the LRU: runs of unhittable blocks by the slice, hashed
        blocks one by one (their hashes evicted; the tiers below take their K/V)."""
        lru, stale, ref = self._free_cached, self._stale, self._ref
        cached, block_hash, tree = self._cached, self._block_hash, self._tree
        while need:
            entry = lru.popleft() if tree is None else self._oldest_leaf()
            if type(entry) is list:              # (a run: its next block to take is its last)
                if len(entry) > need:
                    taken = entry[-need:]
                    del entry[-need:]
                    lru.appendleft(entry)
                    entry = taken
                entry.reverse()
                table += entry
                need -= len(entry)
                continue
            b = entry
            if stale[b]:                         # an entry older than the block's reuse: skip it
                stale[b] -= 1
                continue
            h = block_hash[b]
            if self._tiers is not None:          # offloaded to the host tier, not lost
                self._tiers.offload(b, h)
            del cached[h]
            if tree is not None:
                tree.remove(h)
            self._hits.clear()
            block_hash[b] = None
            ref[b] = 1
            table.append(b)
            need -= 1

    def _oldest_leaf(self):
        """The least recently freed LRU entry that no cached block continues (radix leaf-LRU: a run
        of unhittable blocks, or a hashed block that is a leaf), else the least recently freed one."""
        lru, stale, block_hash, tree = self._free_cached, self._stale, self._block_hash, self._tree
        passed = []
        while lru:
            entry = lru.popleft()
            if type(entry) is not list:
                if stale[entry]:
                    stale[entry] -= 1
                    continue
                if not tree.is_leaf(block_hash[entry]):
                    passed.append(entry)
                    continue
            lru.extendleft(reversed(passed))
            return entry
        entry = passed.pop(0)
        lru.extendleft(reversed(passed))
        return entry

    def register(self, table: list, hashes: list, num_computed: int, start: int = 0) -> int:
        """Publish full, computed blocks of a table in the prefix cache; returns blocks done."""
        full = min(num_computed // self.block_size, len(hashes))
        if self.prefix_caching and self._tree is not None:
            cached, block_hash, tree = self._cached, self._block_hash, self._tree
            for i in range(start, full):
                b, h = table[i], hashes[i]
                if block_hash[b] is None and h not in cached:
                    cached[h] = b
                    block_hash[b] = h
                    tree.insert(h, hashes[i - 1] if i else None, b)
                    self._hits.clear()
        elif self.prefix_caching:
            cached, block_hash = self._cached, self._block_hash
            for b, h in zip(table[start:full], hashes[start:full]):
                if block_hash[b] is None and h not in cached:
                    cached[h] = b
                    block_hash[b] = h
                    if self._hits:
                        self._hits.clear()
        if self._tiers is not None:               # a copy on a lower tier is superseded
            self._tiers.discard(hashes[start:full])
        return max(full, start)

    def release(self, table: list, unhittable: int = 0) -> int:
        """Drop a table's references (tail first, so tails are evicted before shared heads).

        `unhittable`: its first blocks that no request can ever hit (a finished prompt of its own,
        `own_block_keys`): unless already published, they go to the LRU exactly where hashed ones
        would, as runs (one entry each): the same eviction order, with no hash map entry."""
        if self._hits:
            self._hits.clear()
        ref, block_hash, plain, lru = self._ref, self._block_hash, self._plain, self._free_cached
        unhittable = unhittable if self.prefix_caching else 0
        n = len(table)
        # a table nobody shares, none of it published (the common case): the same moves as the loop
        # below, by the slice, their counts left at 1 (every held block counts 1 until one is acquired,
        # and a block has a hash only while the prefix cache maps it: none while that is empty)
        if n > 1 and (not self._acquired or _all_are(table, ref, 1)) and \
                (not self._cached or _all_are(table, block_hash, None)):
            tail = table[unhittable:]
            tail.reverse()
            plain += tail
            if unhittable:
                run = table[:unhittable]         # (a run is kept next-taken last: table order here)
                lru.append(run)
                self._num_free_cached += len(run)
            table.clear()
            return n
        freed, to_lru, run = 0, 0, []
        for i in range(len(table) - 1, -1, -1):
            b = table[i]
            left = ref[b] - 1
            if left:
                ref[b] = left
                continue
            freed += 1
            if block_hash[b] is not None:          # hashed: to the LRU on its own (a hit may take it)
                ref[b] = 0
                if run:
                    run.reverse()                  # (next-taken last)
                    lru.append(run)
                    to_lru += len(run)
                    run = []
                lru.append(b)
                to_lru += 1
            elif i < unhittable:                   # nobody can hit it: into the run
                run.append(b)
            else:
                plain.append(b)
        if run:
            run.reverse()
            lru.append(run)
            to_lru += len(run)
        self._num_free_cached += to_lru
        table.clear()
        return freed

    def _live_entries(self) -> list:
        """The LRU's entries without stale ones (runs kept whole), least recently freed first."""
        stale, live = list(self._stale), []
        for entry in self._free_cached:
            if type(entry) is not list and stale[entry]:
                stale[entry] -= 1
            else:
                live.append(entry)
        return live

    def free_cached_blocks(self) -> list:
        """The free cached blocks, least recently freed first (runs of unhittable ones expanded, in
        the order they are taken)."""
        out = []
        for entry in self._live_entries():
            if type(entry) is list:
                out += reversed(entry)
            else:
                out.append(entry)
        return out

    def check(self) -> None:
        """Assert the accounting invariants; used by tests and at drain."""
        ref, block_hash = self._ref, self._block_hash
        refs = self.refs
        assert min(ref) >= 0, "negative reference count"
        used = len(refs) - refs.count(0)
        assert used + self.num_free == self.num_blocks, (used, self.num_free, self.num_blocks)
        plain = self._plain[self._plain_head:]
        assert not plain or list(map(ref.__getitem__, plain)).count(1) == len(plain) and \
            list(map(block_hash.__getitem__, plain)).count(None) == len(plain), "held block in free list"
        entries = self._live_entries()
        lru = self.free_cached_blocks()
        assert len(lru) == self._num_free_cached, "free cached count out of sync"
        runs = [e for e in entries if type(e) is list]
        hashed = [e for e in entries if type(e) is not list]
        in_runs = list(chain.from_iterable(runs))
        assert all(runs) and list(map(block_hash.__getitem__, in_runs)).count(None) == len(in_runs) and \
            None not in map(block_hash.__getitem__, hashed), "LRU entry of a wrong kind"
        assert not any(map(ref.__getitem__, hashed)) and list(map(ref.__getitem__, in_runs)).count(1) == len(in_runs), \
            "held block in LRU"
        assert len(set(plain)) == len(plain), "block freed twice"
        assert len(set(lru)) == len(lru) and not set(lru) & set(plain), "block in the LRU twice"
        for h, b in self._cached.items():
            assert block_hash[b] == h, "hash map out of sync"
        if self._tree is not None:
            self._tree.check(self._cached)
        if self._tiers is not None:
            self._tiers.check(self)
