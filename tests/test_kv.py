"""The block pool against an independent model, over random grow/hit/register/release sequences.

The model tracks reference counts, which hash each block publishes, the plain free blocks and
the cached free blocks in least-recently-freed order. After every operation the manager must
agree with it exactly (free + used == total, ref counts, prefix lookups), allocation must take
plain free blocks before evicting cached ones and evict the least recently freed first, and
at drain every reference count is 0. The KV manager's cost questions (blocks a preemption frees,
a plan's blocks with cache hits on released blocks) are checked against what committing really takes.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from policylab.core.kv import chain_hashes
from policylab.core.kv.blocks import BlockPool

PREFIXES = [np.arange(1000 * k, 1000 * k + 64, dtype=np.int32) for k in range(1, 4)]


class BlockPoolMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(1, 12), block_size=st.sampled_from([1, 2, 4]), caching=st.booleans())
    def setup(self, num_blocks, block_size, caching):
        self.kv = BlockPool(num_blocks, block_size, caching)
        self.bs, self.caching = block_size, caching
        self.reqs = {}                    # id -> [tokens, table]
        self.next_id = 0
        self.ref = [0] * num_blocks
        self.hash_of = {}                 # block -> published hash
        self.cache = {}                   # hash -> block
        self.lru = []                     # free published blocks, least recently freed first

    # ------------------------------------------------------------- model
    def plain_free(self) -> set:
        return {b for b, r in enumerate(self.ref) if r == 0 and b not in self.hash_of}

    def expected_hits(self, hashes, max_blocks) -> list:
        hits = []
        for h in hashes[:max_blocks] if self.caching else []:
            if h not in self.cache:
                break
            hits.append(self.cache[h])
        return hits

    def allocate(self, table, num_tokens):
        """grow() and check which blocks it took: plain ones first, then the LRU cached ones."""
        need = math.ceil(num_tokens / self.bs) - len(table)
        plain, before = self.plain_free(), len(table)
        self.kv.grow(table, num_tokens)
        new = table[before:]
        assert len(new) == max(need, 0)
        from_plain = min(len(new), len(plain))
        assert set(new[:from_plain]) <= plain, "evicted a cached block while plain ones were free"
        evicted = new[from_plain:]
        assert evicted == self.lru[:len(evicted)], "evicted blocks are not the least recently freed"
        for b in evicted:
            self.lru.pop(0)
            del self.cache[self.hash_of.pop(b)]
        for b in new:
            self.ref[b] = 1

    def publish(self, table, tokens):
        hashes = chain_hashes(tokens, self.bs)
        self.kv.register(table, hashes, len(tokens))
        if self.caching:
            for k, h in enumerate(hashes):
                b = table[k]
                if b not in self.hash_of and h not in self.cache:
                    self.hash_of[b], self.cache[h] = h, b

    # ------------------------------------------------------------- rules
    @rule(prefix=st.integers(0, 2), shared=st.integers(0, 16), unique=st.integers(0, 12))
    def start(self, prefix, shared, unique):
        """A new request: look up its prefix, take the hits, allocate the rest, publish."""
        rid = self.next_id
        self.next_id += 1
        tokens = np.concatenate([PREFIXES[prefix][:shared],
                                 np.arange(unique, dtype=np.int32) + 10_000 * (rid + 1)])
        if len(tokens) == 0:
            return
        hashes = chain_hashes(tokens, self.bs)
        max_hit = (len(tokens) - 1) // self.bs
        hits = list(self.kv.lookup(hashes, max_hit))
        assert hits == self.expected_hits(hashes, max_hit)
        cost = math.ceil(len(tokens) / self.bs) - len(hits) + self.kv.reclaim_cost(hits)
        assert self.kv.reclaim_cost(hits) == sum(1 for b in hits if self.ref[b] == 0)
        if cost > self.kv.num_free:
            return                        # the engine's validation never lets this through
        table = []
        self.kv.acquire(table, hits)
        for b in hits:
            if self.ref[b] == 0:
                self.lru.remove(b)
            self.ref[b] += 1
        self.allocate(table, len(tokens))
        self.publish(table, tokens)
        self.reqs[rid] = [tokens, table]

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def decode(self, data):
        """One more token for a running request (a new block when the last one is full)."""
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        tokens, table = self.reqs[rid]
        tokens = np.append(tokens, np.int32(7 + len(tokens)))
        need = math.ceil(len(tokens) / self.bs) - len(table)
        if need > self.kv.num_free:
            free = self.kv.num_free
            with pytest.raises(MemoryError):
                self.kv.grow(table, len(tokens))
            assert self.kv.num_free == free and len(table) == math.ceil((len(tokens) - 1) / self.bs)
            return
        self.allocate(table, len(tokens))
        self.publish(table, tokens)
        self.reqs[rid][0] = tokens

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def release(self, data):
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        self.free_request(rid)

    def free_request(self, rid):
        _, table = self.reqs.pop(rid)
        expected = 0
        for b in reversed(table):         # tail first: tails are evicted before shared heads
            self.ref[b] -= 1
            if self.ref[b] == 0:
                expected += 1
                if b in self.hash_of:
                    self.lru.append(b)
        assert self.kv.release(table) == expected
        assert table == []

    @rule()
    def drain(self):
        for rid in sorted(self.reqs):
            self.free_request(rid)
        assert not any(self.kv.refs) and self.kv.num_free == self.kv.num_blocks

    # -------------------------------------------------------- invariants
    @invariant()
    def agrees_with_model(self):
        kv = self.kv
        kv.check()
        assert list(kv.refs) == self.ref
        assert kv.num_free + kv.num_used == kv.num_blocks
        assert kv.num_free == sum(1 for r in self.ref if r == 0)
        assert kv.cache_map == self.cache
        for tokens, table in self.reqs.values():
            assert len(table) == math.ceil(len(tokens) / self.bs)

    def teardown(self):
        if getattr(self, "kv", None) is not None:
            self.drain()


TestBlockPool = BlockPoolMachine.TestCase
# The machine is cheap per example and finds planted accounting bugs only after many runs: it gets
# more examples than the suite's default in the first tier, and far more in the second (a profile
# that asks for more still gets more).
TestBlockPool.settings = settings(max_examples=max(40, settings.default.max_examples))


@pytest.mark.slow
class TestBlockPoolDeep(BlockPoolMachine.TestCase):
    settings = settings(max_examples=max(300, settings.default.max_examples))


def test_freed_blocks_are_reused_least_recently_freed_first():
    kv = BlockPool(4, 2)
    a, b = [], []
    tokens_a, tokens_b = np.arange(4, dtype=np.int32), np.arange(100, 104, dtype=np.int32)
    for table, tokens in ((a, tokens_a), (b, tokens_b)):
        kv.grow(table, 4)
        kv.register(table, chain_hashes(tokens, 2), 4)
    blocks_a, blocks_b = list(a), list(b)
    kv.release(a)
    kv.release(b)                         # a's blocks were freed first: evicted first
    c = []
    kv.grow(c, 4)
    assert sorted(c) == sorted(blocks_a)
    assert kv.lookup(chain_hashes(tokens_a, 2), 2) == ()
    assert list(kv.lookup(chain_hashes(tokens_b, 2), 2)) == blocks_b   # b still hits
    kv.release(c)
    kv.check()
    assert not any(kv.refs)


def test_a_block_hit_while_free_moves_to_the_back_of_the_lru_and_stale_entries_stay_bounded():
    """Hits on free blocks leave stale entries behind in the LRU deque: they are skipped on
    eviction (the hit block counts as freed at its latest release) and dropped when they pile up."""
    kv = BlockPool(3, 2)
    tables, hashes = [], []
    for k in range(3):
        table, tokens = [], np.arange(10 * k, 10 * k + 2, dtype=np.int32)
        kv.grow(table, 2)
        hashes.append(chain_hashes(tokens, 2))
        kv.register(table, hashes[-1], 2)
        tables.append(table)
    first = tables[0][0]
    for table in tables:
        kv.release(table)                 # LRU: the blocks of requests 0, 1, 2

    def hit_and_release():                # request 0's prefix comes back
        table = []
        kv.acquire(table, kv.lookup(hashes[0], 1))
        assert table == [first]
        kv.check()
        kv.release(table)                 # request 0's block is now the most recently freed

    hit_and_release()
    hit_and_release()
    assert kv.free_cached_blocks()[-1] == first and kv.num_free == 3
    evicted = []
    kv.grow(evicted, 4)                   # two blocks: requests 1 and 2 are evicted, 0 stays
    assert first not in evicted and kv.lookup(hashes[0], 1) == (first,)
    assert kv.lookup(hashes[1], 1) == () and kv.lookup(hashes[2], 1) == ()
    kv.release(evicted)
    for _ in range(20):
        hit_and_release()
        assert len(kv._free_cached) <= 2 * kv.num_blocks + 1
    assert kv.free_cached_blocks() == [first] and kv.num_free == 3
    kv.check()


@given(tokens=st.lists(st.integers(0, 2 ** 17 - 1), max_size=80), block_size=st.sampled_from([1, 4, 16]),
       split=st.integers(0, 5), position=st.integers(0, 79))
def test_prefix_hashes_continue_from_a_split_and_change_from_the_first_changed_block_on(
        tokens, block_size, split, position):
    """Block k's hash stands for every token up to its end: hashing in two pieces (`prev`,
    `start`) gives the same list, and changing one token changes that block's hash and every
    later one, never an earlier one. Zero ids count too (an all-zero block still moves the hash)."""
    ids = np.array(tokens, np.int32)
    whole = chain_hashes(ids, block_size)
    cut = min(split, len(ids) // block_size) * block_size
    head = chain_hashes(ids[:cut], block_size)
    assert head + chain_hashes(ids[cut:], block_size, head[-1] if head else None, cut) == whole
    if position < len(ids):
        changed = ids.copy()
        changed[position] = (changed[position] + 1) % 2 ** 17
        other, k = chain_hashes(changed, block_size), position // block_size
        assert other[:k] == whole[:k] and all(a != b for a, b in zip(other[k:], whole[k:]))
    assert len(set(chain_hashes(np.zeros(len(ids), np.int32), block_size))) == len(ids) // block_size


def test_unhittable_blocks_are_freed_into_the_lru_where_hashed_ones_would_be():
    """A finished prompt of its own is freed unpublished: the same LRU order (and the same block
    for every later allocation) as publishing it, its partial last block plain, and evicting
    it touches no hash map."""
    def replay(unhittable: bool) -> tuple:
        kv = BlockPool(6, 2)
        a, b = [], []
        kv.grow(a, 5)                              # 2 full blocks + a partial one
        kv.grow(b, 4)
        kv.register(b, chain_hashes(np.arange(100, 104, dtype=np.int32), 2), 4)
        if unhittable:
            kv.release(a, 5 // 2)
        else:
            kv.register(a, chain_hashes(np.arange(5, dtype=np.int32), 2), 5)
            kv.release(a)
        kv.release(b)
        cached_after_release = len(kv.cache_map)
        kv.check()
        c = []
        kv.grow(c, 12)                             # every block: the plain one first, then LRU order
        kv.release(c)
        kv.check()
        return c, cached_after_release, dict(kv.cache_map)
    published, unpublished = replay(False), replay(True)
    assert published[0] == unpublished[0]
    assert (published[1], unpublished[1]) == (4, 2) and published[2] == unpublished[2] == {}


# ------------------------------------------------------------------ the KV manager's cost questions
def _manager_with_a_shared_prefix():
    """Block size 4, 10 blocks. A computed its 12-token prompt (3 blocks, published); B has the same
    prompt, started on A's first 2 blocks (its last token is always computed) and took a third of
    its own: A and B hold 2 blocks together, 1 block each alone; 6 blocks are free. C and D have
    the same prompt and wait."""
    from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
    from policylab.core.kv.manager import KVManager
    from policylab.core.request import Request
    from policylab.dataplane.config import DataplaneConfig
    from policylab.dataplane.sim import SimDataPlane

    bs, prompt = 4, np.arange(500, 512, dtype=np.int32)
    plane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"))
    kv = KVManager(10, EngineConfig(block_size=bs, num_blocks=10), plane)
    a, b, c, d = (Request(rid, 0.0, prompt, 8, block_hashes=chain_hashes(prompt, bs)) for rid in range(4))
    kv.grow(a.block_table, 12)
    a.num_computed_tokens = 12
    kv.register(a.block_table, a.block_hashes, 12)
    kv.start(b, kv.hits(b))
    kv.grow(b.block_table, 12)
    b.num_computed_tokens = 12
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert kv.num_free == 10 - 4
    return kv, a, b, c, d


@pytest.mark.timeout(10)
def test_freed_by_counts_only_the_blocks_nobody_else_holds():
    kv, a, b, _, _ = _manager_with_a_shared_prefix()
    assert (kv.freed_by(a), kv.freed_by(b)) == (1, 1)     # each its own third block, not the 2 shared
    assert kv.release(a.block_table) == 1                 # what releasing really frees
    assert kv.freed_by(b) == 3                            # now B alone holds all of its blocks
    assert kv.release(b.block_table) == 3 and kv.num_free == 10
    kv.check()


@pytest.mark.timeout(10)
def test_plan_cost_counts_cache_hits_on_blocks_the_preemptions_release_once_and_equals_the_commit():
    """Preempting A and B releases all 4 of their blocks (available: 6 + 4). C and D each reuse the
    2 shared blocks and compute 4 tokens into 1 new block: 1 + 1 new, plus the 2 hit blocks, which
    nobody holds once A and B are gone and so take free blocks, counted once for both: 4 needed."""
    kv, a, b, c, d = _manager_with_a_shared_prefix()
    hits = {r.req_id: kv.hits(r) for r in (c, d)}           # as validated: before the release
    assert hits[2] == hits[3] == tuple(a.block_table[:2])
    needed, available = kv.plan_cost([a, b], [(c, 4), (d, 4)])
    assert (needed, available) == (1 + 1 + 2, 6 + 4)
    assert kv.plan_cost([], [(c, 4), (d, 4)]) == (2, 6)     # held by A and B: hits take no free block
    kv.release(a.block_table)
    kv.release(b.block_table)
    assert kv.num_free == available
    for r in (c, d):                                         # the commit: hits first, then allocations
        kv.start(r, hits[r.req_id])
        r.num_computed_tokens = 8
    for r in (c, d):
        kv.grow(r.block_table, 12)
    assert kv.num_free == available - needed
    kv.check()
