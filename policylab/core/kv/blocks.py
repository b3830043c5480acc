"""The block pool under the KV manager: blocks as pages, block tables as page tables (DESIGN §4).

Full blocks carry a prefix hash (of every token up to the block's end, DESIGN §4's chained
hash) so identical prefixes share physical blocks. Freed blocks keep their hash and sit in an
LRU list until reused, so a later request (or a preempted one coming back) can hit them.
Invariant: free + used == total, and at drain every reference count is 0.
"""
from __future__ import annotations

from collections import Counter, deque
from types import MappingProxyType

from policylab.core.kv.radix import RadixTree


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks that hold `num_tokens` tokens: the one block-count formula (a ceiling division)."""
    return -(-num_tokens // block_size)


UNHITTABLE = object()   # block_hash of a free block in the LRU that no request can ever hit


def new_blocks(r, n: int, hits: tuple, block_size: int) -> int:
    """Blocks beyond its table (running) or its cache hits `hits` (waiting) that giving `n` more
    tokens to request `r` takes."""
    table = r.block_table
    if table:
        need = blocks_for(r.num_computed_tokens + n, block_size) - len(table)
    else:
        need = blocks_for(max(r.num_computed_tokens, len(hits) * block_size) + n, block_size) - len(hits)
    return need if need > 0 else 0


def plan_cost(ref, num_free: int, block_size: int, hits, preempted: list, chunks) -> tuple:
    """(blocks needed, blocks available) of giving `chunks` ((request, tokens) pairs) their tokens
    once the `preempted` requests have released their tables, over reference counts `ref` (block
    id -> count) and a prefix-cache lookup `hits` (request -> cached block ids). A block is
    available when every reference to it is a preempted one; a cache hit on a block that nobody
    holds after the preemptions takes a free block, counted once however many requests hit it."""
    released = Counter()
    for r in preempted:
        released.update(r.block_table)
    available = num_free + sum(1 for b, k in released.items() if ref[b] == k)
    needed, reclaimed = 0, set()
    for r, n in chunks:
        cached = () if r.block_table else hits(r)
        needed += new_blocks(r, n, cached, block_size)
        if cached:
            reclaimed.update(b for b in cached if ref[b] == released[b])
    return needed + len(reclaimed), available


class BlockPool:
    """Reference counts, the free lists, the prefix index and the LRU of free cached blocks. Request-level
    operations and the strategies above the pool (swap, tiers, copy-on-write) are `KVManager`'s."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 index: str = "hash"):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        if index not in ("hash", "radix"):
            raise ValueError(f"prefix cache index must be 'hash' or 'radix', got {index!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.prefix_caching = enable_prefix_caching
        self._tree = RadixTree() if index == "radix" and enable_prefix_caching else None   # leaf-LRU
        self._ref = [0] * num_blocks
        self._block_hash: list = [None] * num_blocks
        self._cached: dict = {}                  # hash -> block id
        self._free_plain = deque(range(num_blocks))   # free, no reusable content
        # Free, hashed blocks, least recently freed first. A cache hit takes a block out of the
        # middle: its entry stays and is skipped later (`_stale`), so freeing and reusing a block
        # touch only the ends of a deque, not an ordered hash table (a cache miss per block).
        self._free_cached: deque = deque()
        self._stale = [0] * num_blocks           # per block: its older entries in free_cached
        self._num_free_cached = 0
        self._hits: dict = {}                    # req_id -> its cache hits, until the cache changes
        self._tiers = None                       # host/disk tiers below the cache (KVManager's strategy)

    @property
    def num_free(self) -> int:
        return len(self._free_plain) + self._num_free_cached

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free_plain) - self._num_free_cached   # (every step)

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
        """Every block's reference count, by block id."""
        return tuple(self._ref)

    @property
    def cache_map(self):
        """The prefix cache, hash -> block id (read-only)."""
        return MappingProxyType(self._cached)

    def holds(self, b: int) -> bool:
        """Whether some block table holds block `b`."""
        return self._ref[b] > 0

    def acquire(self, table: list, blocks) -> None:
        """Append cache-hit blocks to a block table, taking a reference on each."""
        if self._tiers is not None:               # lower-tier hits wait for tiers.promote_pending
            blocks = self._tiers.defer(table, blocks)
        ref = self._ref
        for b in blocks:
            if ref[b] == 0:                      # free: its entry in free_cached goes stale
                self._stale[b] += 1
                self._num_free_cached -= 1
            ref[b] += 1
            table.append(b)
        if len(self._free_cached) > 2 * self.num_blocks:     # mostly stale entries: drop them
            self._free_cached = deque(self.free_cached_blocks())
            self._stale = [0] * self.num_blocks

    def grow(self, table: list, num_tokens: int) -> None:
        """Allocate blocks so `table` covers num_tokens tokens."""
        need = blocks_for(num_tokens, self.block_size) - len(table)
        if need > self.num_free:
            raise MemoryError(f"KV cache exhausted: need {need} blocks, {self.num_free} free")
        self._take(table, need)

    def grow_one(self, table: list) -> None:
        """One more block for a table whose last block is full (a decode crossing a block boundary)."""
        if self._free_plain:
            b = self._free_plain.popleft()
            self._ref[b] = 1
            table.append(b)
        elif self._num_free_cached:
            self._take(table, 1)
        else:
            raise MemoryError("KV cache exhausted: need 1 block, 0 free")

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
        hashes). Every block a request ever holds passes here and through release(): locals."""
        plain, ref = self._free_plain, self._ref
        from_plain = min(need, len(plain))
        for _ in range(from_plain):
            b = plain.popleft()
            ref[b] = 1
            table.append(b)
        if need > from_plain:
            oldest, stale = self._free_cached.popleft, self._stale
            cached, block_hash = self._cached, self._block_hash
            self._num_free_cached -= need - from_plain
            for _ in range(need - from_plain):
                if self._tree is None:
                    b = oldest()
                    while stale[b]:              # an entry older than the block's reuse: skip it
                        stale[b] -= 1
                        b = oldest()
                else:
                    b = self._oldest_leaf()
                h = block_hash[b]
                if h is not UNHITTABLE:
                    if self._tiers is not None:   # offloaded to the host tier, not lost
                        self._tiers.offload(b, h)
                    del cached[h]
                    if self._tree is not None:
                        self._tree.remove(h)
                    self._hits.clear()
                block_hash[b] = None
                ref[b] = 1
                table.append(b)

    def _oldest_leaf(self) -> int:
        """Take the least recently freed cached block that no cached block continues (radix
        leaf-LRU); the least recently freed one when every free cached block has a continuation."""
        lru, stale, block_hash, tree = self._free_cached, self._stale, self._block_hash, self._tree
        passed = []
        while lru:
            b = lru.popleft()
            if stale[b]:
                stale[b] -= 1
                continue
            h = block_hash[b]
            if h is UNHITTABLE or tree.is_leaf(h):
                lru.extendleft(reversed(passed))
                return b
            passed.append(b)
        b = passed.pop(0)
        lru.extendleft(reversed(passed))
        return b

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
        `own_block_keys`): unless already published, they go to the LRU exactly where hashed
        ones would, marked UNHITTABLE: the same eviction order, with no hash map entry."""
        ref, block_hash, plain, lru = self._ref, self._block_hash, self._free_plain, self._free_cached
        if unhittable and self.prefix_caching:
            for b in table[:unhittable]:
                if block_hash[b] is None:
                    block_hash[b] = UNHITTABLE
        if self._hits:
            self._hits.clear()
        freed, plain_before = 0, len(plain)
        for b in reversed(table):
            left = ref[b] - 1
            ref[b] = left
            if not left:
                freed += 1
                if block_hash[b] is None:
                    plain.append(b)
                else:
                    lru.append(b)
        self._num_free_cached += freed - (len(plain) - plain_before)
        table.clear()
        return freed

    def free_cached_blocks(self) -> list:
        """The free, hashed blocks, least recently freed first (free_cached without stale entries)."""
        stale, live = list(self._stale), []
        for b in self._free_cached:
            if stale[b]:
                stale[b] -= 1
            else:
                live.append(b)
        return live

    def check(self) -> None:
        """Assert the accounting invariants; used by tests and at drain."""
        used = sum(1 for r in self._ref if r > 0)
        assert min(self._ref) >= 0, "negative reference count"
        assert used + self.num_free == self.num_blocks, (used, self.num_free, self.num_blocks)
        assert all(self._ref[b] == 0 for b in self._free_plain), "held block in free list"
        lru = self.free_cached_blocks()
        assert len(lru) == self._num_free_cached, "free cached count out of sync"
        assert all(self._ref[b] == 0 and self._block_hash[b] is not None for b in lru), "held block in LRU"
        assert len(set(self._free_plain)) == len(self._free_plain), "block freed twice"
        assert len(set(lru)) == len(lru), "block in the LRU twice"
        for h, b in self._cached.items():
            assert self._block_hash[b] == h, "hash map out of sync"
        if self._tree is not None:
            self._tree.check(self._cached)
        if self._tiers is not None:
            self._tiers.check(self)
