"""The one KV manager (vLLM v1's `KVCacheManager`): every block of an engine's KV lives behind it.

Policies ask it cost questions through their view; the engine and its extensions change KV only
through its operations (start a request on its cache hits, allocate, publish, free, evict to the
host or for recompute, restore, fork, trim, receive a prefilled request). Its strategies are
chosen when it is built, from the engine's config and the data plane's capabilities, and never
attached from outside:

- the prefix index: chained hashes or a radix tree (`engine.prefix_cache`);
- swap space: the host tier swapped-out requests wait on (`engine.host_kv_blocks`);
- prefix tiers: host and disk tiers under the prefix cache (`engine.prefix_host_blocks`);
- copy-on-write: blocks that forks share (`sharing`: a run that forks requests);
- when a prompt block is published: once computed, or once scheduled (`engine.publish_on_schedule`,
  vLLM's way: `policylab.core.kv.same_step`).

Swap and the tiers cross one device-host link: their copies since the last executed step are
charged to the next one, once, in series (`timed`).
"""
from __future__ import annotations

from policylab.core.kv.blocks import BlockPool
from policylab.core.kv.cost import new_blocks, plan_cost
from policylab.core.kv.cow import SharedWrites
from policylab.core.kv.hashes import chain_hashes, own_block_keys
from policylab.core.kv.host import SWAP_STATS, HostTier, SwapSpace, make_link
from policylab.core.kv.plane import PlaneKV
from policylab.core.kv.same_step import same_step_hits
from policylab.core.kv.tiers import PrefixTiers, TierRefs, block_key


NO_HOST = HostTier(0)        # the host tier of a KV manager without swap space: nothing to hold


class KVManager(BlockPool):
    def __init__(self, num_blocks: int, cfg, plane, seed: int = 0, sharing: bool = False):
        super().__init__(num_blocks, cfg.block_size, cfg.enable_prefix_caching, cfg.prefix_cache)
        self.seed = seed
        self.plane = PlaneKV(plane, cfg.block_size)
        self.stats: dict = dict.fromkeys(SWAP_STATS, 0)      # summary.json's `kv_tiers`
        self.stats["transfer_time"] = 0.0
        for key, blocks in (("host_kv_blocks", cfg.host_kv_blocks), ("prefix_host_blocks", cfg.prefix_host_blocks)):
            if blocks and self.plane.block_bytes is None:
                raise ValueError(f"engine.{key}={blocks}: data plane {self.plane.name} cannot say how many "
                                 "bytes a KV block holds")
        self._link = make_link(cfg.swap_link, cfg.swap_bandwidth, cfg.swap_latency, cfg.swap_overlap)
        self._swap = SwapSpace(cfg.host_kv_blocks, self.plane, self.stats) if cfg.host_kv_blocks else None
        self._tiers = PrefixTiers(cfg, self.plane, self.stats) \
            if cfg.prefix_host_blocks and cfg.enable_prefix_caching else None
        self._cow = SharedWrites(self._ref, cfg.block_size) if sharing else None
        self.sharing = self._cow is not None      # (blocks forks share: asked a few times every step)
        self.uses_link = self._swap is not None or self._tiers is not None
        self.host_blocks = cfg.host_kv_blocks
        self.publishes_on_schedule = bool(cfg.publish_on_schedule) and cfg.enable_prefix_caching

    # ------------------------------------------------------------------ facts
    @property
    def host_free(self) -> int:
        """Free blocks of swap space (0 when there is none)."""
        return self._swap.host.num_free if self._swap is not None else 0

    @property
    def host_used(self) -> int:
        return self._swap.host.num_used if self._swap is not None else 0

    @property
    def host(self) -> HostTier:
        """The swap space's host tier, for checks (an empty one when there is no swap space)."""
        return self._swap.host if self._swap is not None else NO_HOST

    @property
    def tiers(self):
        """The prefix tiers, for checks (None: none)."""
        return self._tiers

    @property
    def has_tiers(self) -> bool:
        return self._tiers is not None

    # ------------------------------------------------------------------ questions (views, validator)
    def reclaim_cost(self, blocks) -> int:
        """How many free blocks taking `blocks` (cache hits) consumes: those nobody holds."""
        ref = self._ref if self._tiers is None else TierRefs(self._ref)   # (a lower-tier hit: held by nobody)
        return sum(1 for b in blocks if ref[b] == 0)

    def hits(self, r) -> tuple:
        """Prefix-cache blocks request `r` would reuse if it started now (none once it holds KV or
        has computed tokens, unless swapped out: then its computed blocks still on the device need
        no copy back; its last known token is always left to compute). Remembered until the
        cache changes."""
        if r.block_table or r.num_computed_tokens and not r.swapped_blocks:
            return ()
        blocks = self._hits.get(r.req_id)
        if blocks is None:
            most = r.num_computed_tokens // self.block_size if r.swapped_blocks else \
                (r.num_tokens - 1) // self.block_size
            blocks = self._hits[r.req_id] = self.lookup(r.block_hashes, most)
            if self._tiers is not None and not r.swapped_blocks:     # continued on the host/disk tiers
                blocks = self._hits[r.req_id] = self._tiers.extend(self._cached, r.block_hashes, blocks, most)
        return blocks

    def cached_keys(self, r) -> tuple:
        """`hits(r)` as policies compare them: device block ids, a lower tier's block a negative key."""
        hits = self.hits(r)
        return hits if self._tiers is None else tuple(map(block_key, hits))

    def blocks_needed(self, r, n: int) -> int:
        """Free blocks that giving `n` more tokens to request `r` consumes (its cache hits included)."""
        if r.block_table:        # running: no cache lookup, just the tail of its table, and the
            copies = self._cow.blocks_for_write(r, n) if self._cow is not None else 0   # copies of blocks
            return new_blocks(r, n, (), self.block_size) + copies                        # its forks share
        hits = self.hits(r)
        return new_blocks(r, n, hits, self.block_size) + (self.reclaim_cost(hits) if hits else 0)

    def freed_by(self, r) -> int:
        """Blocks that releasing request `r`'s table frees: those no other request holds."""
        ref = self._ref
        return sum(1 for b in r.block_table if ref[b] == 1)

    def plan_cost(self, preempted: list, chunks) -> tuple:
        """(blocks needed, blocks available) of giving `chunks` ((request, tokens) pairs) their tokens
        once the `preempted` requests have released their tables (the module-level `plan_cost`)."""
        ref = self._ref if self._tiers is None else TierRefs(self._ref)
        return plan_cost(ref, self.num_free, self.block_size, self.hits, preempted, chunks)

    def same_step_hits(self, entries) -> dict:
        """Under publish-on-schedule, the prompt blocks each request starting in `entries` ((request,
        tokens) pairs in plan order) takes beyond its cache hits because earlier entries compute
        them this step: {req_id: their hashes} (`policylab.core.kv.same_step`; {} otherwise)."""
        return same_step_hits(entries, self.hits, self.block_size) if self.publishes_on_schedule else {}

    def write_copies(self, writes, preempted=()) -> int:
        """Blocks the copy-on-writes of `writes` ((request, tokens) pairs of one step) take (0 when
        no block is shared)."""
        return self._cow.copies(writes, preempted) if self._cow is not None else 0

    # ------------------------------------------------------------------ operations
    def start(self, r, blocks) -> None:
        """Request `r` starts on its cache hits `blocks` (taken before any allocation can evict one;
        hits on a lower tier come up with `promote_pending`)."""
        self.acquire(r.block_table, blocks)

    def take_published(self, r, hashes) -> int:
        """Request `r`, just started on its cache hits, also takes the blocks of `hashes` that entries
        committed before it in this step have published and hold (`same_step_hits`); tokens taken."""
        cached, ref, blocks = self._cached, self._ref, []
        for h in hashes:
            b = cached.get(h)
            if b is None or not ref[b]:
                break
            blocks.append(b)
        if blocks:
            self.acquire(r.block_table, blocks)
        return len(blocks) * self.block_size

    def publish_scheduled(self, r, end: int) -> None:
        """Publish request `r`'s full prompt blocks up to token `end` as they are scheduled (under
        publish-on-schedule; otherwise the engine publishes them once computed)."""
        bs = self.block_size
        first = r.num_computed_tokens // bs
        if end // bs > first and first < len(r.block_hashes):
            self.register(r.block_table, r.block_hashes, end, first)

    def promote_pending(self) -> None:
        """Bring the lower tiers' hits of the requests just started to the device."""
        if self._tiers is not None:
            self._tiers.promote_pending(self)

    def free(self, r, finished_own_prompt: bool = False) -> int:
        """Publish request `r`'s computed full blocks in the prefix cache, then free its table.

        Prompt blocks are published as they fill; blocks holding output tokens are hashed here,
        once, instead of on every decode step (no other request can hit them while it runs).
        A prompt of its own (`own_block_keys`) can only ever hit its own blocks, after a
        preemption: its blocks are keyed and published when it is preempted, and when it has
        finished (`finished_own_prompt`) they are freed unpublished, in the same LRU order.
        """
        bs = self.block_size
        if finished_own_prompt:
            return self.release(r.block_table, r.num_computed_tokens // bs)
        have, full = len(r.block_hashes), r.num_tokens // bs
        if self.prefix_caching and (full > have or r.own_prompt):    # (its prompt blocks too: unpublished)
            if full > have:
                r.block_hashes.extend(own_block_keys(self.seed, r.req_id, have, full) if r.own_prompt else
                                      chain_hashes(r.token_ids(have * bs, full * bs), bs,
                                                   r.block_hashes[-1] if have else None, have * bs))
            self.register(r.block_table, r.block_hashes, r.num_computed_tokens, 0 if r.own_prompt else have)
        return self.release(r.block_table)

    def swap_out(self, r) -> None:
        """Copy a preempted request's computed blocks to swap space (`free` then frees the device's)."""
        self._swap.swap_out(r, self.block_size)

    def swap_in(self, r, cached: int) -> None:
        """Copy a swapped request's KV back into the device blocks just taken for it (its first
        `cached` blocks were device cache hits: not copied)."""
        self._swap.swap_in(r, cached)

    def drop_swapped(self, r) -> None:
        """A swapped request leaves without running again: its swap space is freed."""
        self._swap.drop(r)

    def fork(self, parent_table: list, num_blocks: int) -> list:
        """A new table holding a reference on the first `num_blocks` blocks of `parent_table`."""
        table: list = []
        self.acquire(table, parent_table[:num_blocks])
        return table

    def adopt(self, table: list, other: list) -> None:
        """`table` drops its blocks and shares every block of `other` instead (a beam replaced by
        the best one), in place: whoever holds `table` keeps holding it."""
        self.release(table)
        self.acquire(table, other)

    def trim(self, table: list, keep: int) -> int:
        """Free the blocks of `table` past its first `keep` (rejected draft tokens' KV); freed count."""
        if len(table) <= keep:
            return 0
        tail = table[keep:]
        del table[keep:]
        return self.release(tail)

    def copy_on_write(self, writes) -> None:
        """Before a step writes ((request, tokens) pairs, in plan order), give each writer of a
        shared block its own copy (nothing when no block is shared)."""
        if self._cow is not None:
            self._cow.copy_on_write(self, self.plane, writes)

    @property
    def copies_made(self) -> int:
        return self._cow.copies_made if self._cow is not None else 0

    def receive(self, num_tokens: int) -> list:
        """A new table for a request prefilled elsewhere, taken when its transfer starts: blocks for
        its `num_tokens` computed tokens."""
        table: list = []
        self.grow(table, num_tokens)
        return table

    def received(self, table: list, payload, hashes, num_computed: int) -> None:
        """Its K/V has arrived: `payload` (another engine's `export`) written into `table`, its full
        blocks published in this cache (hits for later requests from now on)."""
        self.plane.restore(table, payload)
        self.register(table, hashes, num_computed)

    def export(self, table: list):
        """A copy of these blocks' K/V for another engine (None on a plane that holds none)."""
        return self.plane.export(table)

    def timed(self, duration: float) -> float:
        """A step's duration with the link copies since the last executed step (swap space and the
        prefix tiers in series on one link), which it then counts."""
        transfer = 0.0
        swap = self._swap
        if swap is not None and swap.moved_blocks:
            transfer = self._link.transfer_time(swap.moved_blocks, self.plane.block_bytes)
            swap.moved_blocks = 0
            self.stats["transfer_time"] += transfer
        if self._tiers is not None and self._tiers.moved:
            host, disk = self._tiers.transfer_times()
            transfer += host + disk
        return self._link.step_duration(duration, transfer) if transfer else duration

    def check(self) -> None:
        super().check()
        if self._swap is not None:
            self._swap.host.check()
