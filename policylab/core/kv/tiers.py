"""Host and disk tiers under the device prefix cache: a cached block the device evicts is offloaded,
not lost (SGLang's HiCache, LMCache, vLLM's CPU offloading).

When the block pool evicts a free, hashed block to reuse it, its KV is copied to the host tier
(`engine.prefix_host_blocks`); when the host tier is full its least recently offloaded block
moves down to the disk tier (`engine.prefix_disk_blocks`), and the disk tier's least recent one
is dropped. A prompt's lookup continues below the device: a block found on the host or the disk
is a cache hit (`TierHit`) that costs a free device block and its transfer, and it is promoted
back to the device (moved: the tiers are exclusive, a hash lives on exactly one of them).

The tiers are separate from swap preemption's host tier (`engine.host_kv_blocks`): a swapped
request's blocks must come back, a cached block may be dropped, so the two share no capacity
and a policy's `host_capacity` arithmetic never depends on what the cache happens to hold.
Both cross the same device-host link (`engine.swap_link`, `engine.swap_overlap`).
"""
from __future__ import annotations

import os
import tempfile
from collections import OrderedDict

from policylab.core.kv.disk_space import check_free, reserve
from policylab.core.kv.host import make_link

# (read bytes/s, write bytes/s, latency s per step that touches the disk): sustained sequential rates.
DISK_PRESETS = {
    "nvme_gen4": (7.0e9, 5.0e9, 100e-6),     # PCIe 4.0 x4 NVMe SSD
    "nvme_gen5": (14.0e9, 10.0e9, 80e-6),    # PCIe 5.0 x4 NVMe SSD
}

STAT_KEYS = ("host_hit_blocks", "disk_hit_blocks", "host_hit_tokens", "disk_hit_tokens",
             "host_offloaded_blocks", "disk_offloaded_blocks", "dropped_blocks", "superseded_blocks",
             "host_bytes", "disk_bytes", "host_transfer_time", "disk_transfer_time")


def check_tier_config(cfg) -> None:
    """Tier sizes and the disk preset, each message naming its key."""
    for name in ("prefix_host_blocks", "prefix_disk_blocks"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"engine.{name} must be >= 0, got {getattr(cfg, name)}")
    if cfg.prefix_disk_blocks and not cfg.prefix_host_blocks:
        raise ValueError(f"engine.prefix_disk_blocks={cfg.prefix_disk_blocks} needs a host tier above it "
                         "(engine.prefix_host_blocks > 0): blocks reach the disk from the host")
    if cfg.prefix_disk not in DISK_PRESETS:
        raise ValueError(f"engine.prefix_disk must be one of {sorted(DISK_PRESETS)}, got '{cfg.prefix_disk}'")
    if cfg.prefix_host_blocks and not cfg.enable_prefix_caching:
        raise ValueError(f"engine.prefix_host_blocks={cfg.prefix_host_blocks} needs the prefix cache "
                         "(engine.enable_prefix_caching=true): the tiers hold what it evicts")


def block_key(block) -> int:
    """A cache hit as policies see it: a device block is its id; a `TierHit` a negative key of
    its hash, so it never equals a device id and sorts against them."""
    return block if type(block) is int else ~(hash(block) & (2 ** 61 - 1))


class TierHit:
    """A prompt block found below the device (`tier`: host or disk), or on the device after such
    a block: promoted or taken when the request starts. Equal by hash, so one promotion serves
    every request of a step that hits the same block."""

    __slots__ = ("hash", "tier", "index", "hashes")

    def __init__(self, h: int, tier: str, index: int, hashes):
        self.hash, self.tier, self.index, self.hashes = h, tier, index, hashes

    def __eq__(self, other):
        return isinstance(other, TierHit) and other.hash == self.hash

    def __hash__(self):
        return hash(self.hash)

    def __repr__(self):
        return f"TierHit({self.tier}, block {self.index})"


class TierRefs:
    """Reference counts as `kv.plan_cost` reads them, a `TierHit` at 0: every lower-tier hit takes a
    free block (counted once per hash by plan_cost's set)."""

    __slots__ = ("_ref",)

    def __init__(self, ref: list):
        self._ref = ref

    def __getitem__(self, b):
        return 0 if type(b) is TierHit else self._ref[b]


class TierStore:
    """One tier: LRU over hashes, a slot per block, payloads (CPU tensors; None on the sim plane)."""

    def __init__(self, name: str, capacity: int):
        self.name, self.capacity = name, capacity
        self._lru: OrderedDict = OrderedDict()        # hash -> slot, least recently put first
        self._free = list(range(capacity - 1, -1, -1))
        self._payload: dict = {}                      # slot -> payload

    def __contains__(self, h) -> bool:
        return h in self._lru

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def hashes(self) -> list:
        return list(self._lru)

    def put(self, h, payload):
        """Store a block; the (hash, payload) it pushed out when full, or None."""
        out = None
        if not self._free:
            old, slot = self._lru.popitem(last=False)
            out = (old, self._load(slot))
            self._free.append(slot)
        slot = self._free.pop()
        self._lru[h] = slot
        self._store(slot, payload)
        return out

    def take(self, h):
        """Remove a block; its payload."""
        slot = self._lru.pop(h)
        self._free.append(slot)
        return self._load(slot)

    def _store(self, slot: int, payload) -> None:
        self._payload[slot] = payload

    def _load(self, slot: int):
        return self._payload.pop(slot)

    def check(self) -> None:
        slots = list(self._lru.values())
        assert len(slots) + len(self._free) == self.capacity, f"{self.name} tier: used + free != total"
        assert len(set(slots) | set(self._free)) == self.capacity, f"{self.name} tier: a slot lost or used twice"


class DiskStore(TierStore):
    """The disk tier: payloads live in one memory-mapped file of `capacity` block slots (made at the
    first payload, when a block's shape is known; unlinked at once, so nothing is left behind)."""

    def __init__(self, capacity: int, directory: str | None):
        super().__init__("disk", capacity)
        self._dir, self._file, self._empty = directory, None, set()

    def check_space(self, block_bytes: float) -> None:
        """Its file's size against the free space, when the run starts (a mapped file the disk
        cannot back ends the process with SIGBUS at a write)."""
        check_free(self._dir, self.capacity * block_bytes, f"engine.prefix_disk_blocks={self.capacity:,} "
                   f"(engine.prefix_disk_path={self._dir})")

    def _store(self, slot: int, payload) -> None:
        if payload is None:
            self._empty.add(slot)
            return
        if self._file is None:
            self._file = _mapped_file(self._dir, self.capacity, payload)
        self._file[slot].copy_(payload)

    def _load(self, slot: int):
        if slot in self._empty or self._file is None:
            self._empty.discard(slot)
            return None
        return self._file[slot].clone()


def _mapped_file(directory: str | None, capacity: int, like):
    import torch
    fd, path = tempfile.mkstemp(prefix="policylab_kv_disk_", dir=directory)
    try:
        reserve(fd, capacity * like.numel() * like.element_size(), path,
                f"engine.prefix_disk_blocks={capacity:,} (engine.prefix_disk_path={directory})")
        os.close(fd)
        fd = -1
        flat = torch.from_file(path, shared=True, size=capacity * like.numel(), dtype=like.dtype)
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(path)
    return flat.view(capacity, *like.shape)


class PrefixTiers:
    """The engine's host and disk tiers for prefix-cache blocks: offload on eviction, lower-tier
    hits, promotion at a request's start, transfer time charged to the next executed step."""

    def __init__(self, cfg, plane, stats: dict):
        check_tier_config(cfg)
        self.block_size = cfg.block_size
        self.host = TierStore("host", cfg.prefix_host_blocks)
        self.disk = DiskStore(cfg.prefix_disk_blocks, cfg.prefix_disk_path)
        self.link = make_link(cfg.swap_link, cfg.swap_bandwidth, cfg.swap_latency, cfg.swap_overlap)
        self.disk_read, self.disk_write, self.disk_latency = DISK_PRESETS[cfg.prefix_disk]
        self.plane, self.block_bytes = plane, plane.block_bytes
        if plane.holds_contents and self.disk.capacity:      # (payloads: the disk tier has a file)
            self.disk.check_space(self.block_bytes)
        self.verify = cfg.check_invariants
        self._pending: list = []         # (table, its lower-tier hits) deferred by acquire
        self._link_blocks = self._disk_reads = self._disk_writes = 0   # since the last executed step
        self.promoted: list = []         # (hash, device block) promoted by the last commit (for checks)
        self.stats = stats
        stats.update({k: 0 for k in STAT_KEYS})
        for k in ("host_bytes", "disk_bytes", "host_transfer_time", "disk_transfer_time"):
            stats[k] = 0.0

    # ------------------------------------------------------------------ eviction: down the tiers
    def offload(self, b: int, h) -> None:
        """The device evicts cached block `b` (hash `h`) to reuse it: its KV goes to the host tier
        (read before the block is overwritten: its new owner computes only when the step runs)."""
        payload = self.plane.export([b])
        self._link_blocks += 1
        self.stats["host_offloaded_blocks"] += 1
        out = self.host.put(h, payload)
        if out is None:
            return
        if not self.disk.capacity:
            self.stats["dropped_blocks"] += 1
            return
        self._disk_writes += 1
        self.stats["disk_offloaded_blocks"] += 1
        if self.disk.put(*out) is not None:
            self.stats["dropped_blocks"] += 1

    def discard(self, hashes) -> None:
        """Blocks just published on the device: a copy below is superseded (the tiers stay exclusive)."""
        host, disk = self.host, self.disk
        if not len(host) and not len(disk):
            return
        for h in hashes:
            if h in host:
                host.take(h)
                self.stats["superseded_blocks"] += 1
            elif h in disk:
                disk.take(h)
                self.stats["superseded_blocks"] += 1

    # ------------------------------------------------------------------ lookup
    def extend(self, cached, hashes, hits: tuple, most: int) -> tuple:
        """The device's hits `hits` continued below it: the next blocks of `hashes` (up to `most`)
        found on the host or disk tier, or on the device once a lower-tier block precedes them."""
        host, disk = self.host, self.disk
        most = min(most, len(hashes))
        if len(hits) >= most or not len(host) and not len(disk):
            return hits
        out = list(hits)
        for i in range(len(hits), most):
            h = hashes[i]
            tier = "host" if h in host else "disk" if h in disk else "device" if len(out) > len(hits) \
                and h in cached else None
            if tier is None:
                break
            out.append(TierHit(h, tier, i, hashes))
        return tuple(out) if len(out) > len(hits) else hits

    # ------------------------------------------------------------------ promotion
    def defer(self, table: list, blocks) -> tuple:
        """The device blocks of `blocks` to acquire now; its TierHit tail waits for promote_pending
        (after every starting request has taken its device hits, so no promotion evicts one)."""
        for k, b in enumerate(blocks):
            if type(b) is TierHit:
                self._pending.append((table, blocks[k:]))
                return blocks[:k]
        return blocks

    def promote_pending(self, kv) -> None:
        """Bring the deferred hits to the device, in each table's order. First every lower-tier block
        is taken out of its tier and every device one gets a reference, so that allocations made by
        promotions (which may evict and offload) can lose none of them."""
        pending, self._pending, self.promoted = self._pending, [], []
        if not pending:
            return
        cached = kv.cache_map
        payloads, pinned = {}, {}
        for _, tail in pending:
            for hit in tail:
                h = hit.hash
                if h in payloads or h in pinned:
                    continue
                if h in cached:
                    kv.acquire(pin := [], (cached[h],))
                    pinned[h] = pin[0]
                else:
                    tier = self.host if h in self.host else self.disk
                    payloads[h] = (tier.name, tier.take(h))
        for table, tail in pending:
            for hit in tail:
                h = hit.hash
                if h in payloads:
                    self._promote(kv, table, hit, *payloads.pop(h))
                elif h in pinned:
                    table.append(pinned.pop(h))
                else:
                    kv.acquire(table, (cached[h],))
                if len(table) != hit.index + 1:
                    raise AssertionError(f"prefix tiers: block {hit.index} promoted at table position {len(table) - 1}")

    def _promote(self, kv, table: list, hit: TierHit, tier: str, payload) -> None:
        bs = self.block_size
        kv.grow(table, (len(table) + 1) * bs)        # may evict (and offload) a free cached block
        b = table[-1]
        self.plane.restore([b], payload)
        if self.verify:
            assert self.plane.equal([b], payload), f"prefix tiers: block {b} promoted from the {tier} tier with other content"
        kv.register(table, hit.hashes, len(table) * bs, len(table) - 1)
        self._link_blocks += 1
        if tier == "disk":
            self._disk_reads += 1
        self.stats[f"{tier}_hit_blocks"] += 1
        self.stats[f"{tier}_hit_tokens"] += bs
        self.promoted.append((hit.hash, b))

    # ------------------------------------------------------------------ time
    @property
    def moved(self) -> bool:
        return bool(self._link_blocks or self._disk_reads or self._disk_writes)

    def transfer_times(self) -> tuple:
        """(link seconds, disk seconds) of the copies since the last executed step, counted and reset."""
        nbytes = self.block_bytes
        host_time = self.link.transfer_time(self._link_blocks, nbytes)
        disk_time = self.disk_latency + nbytes * (self._disk_reads / self.disk_read + self._disk_writes /
                                                  self.disk_write) if self._disk_reads or self._disk_writes else 0.0
        s = self.stats
        s["host_bytes"] += self._link_blocks * nbytes
        s["disk_bytes"] += (self._disk_reads + self._disk_writes) * nbytes
        s["host_transfer_time"] += host_time
        s["disk_transfer_time"] += disk_time
        self._link_blocks = self._disk_reads = self._disk_writes = 0
        return host_time, disk_time

    # ------------------------------------------------------------------ checks
    def check(self, kv) -> None:
        """Each tier's used + free = its size; a hash lives on one tier only; nothing pending."""
        self.host.check()
        self.disk.check()
        device, host, disk = set(kv.cache_map), set(self.host.hashes()), set(self.disk.hashes())
        assert not (device & host or device & disk or host & disk), "prefix tiers: a block cached on two tiers"
        assert not self._pending, "prefix tiers: promotions left pending"
