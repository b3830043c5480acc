"""Swap space: the host-memory KV of swapped-out requests, and the link KV crosses to reach it.

A plan may preempt a running request by swap instead of recompute (`StepPlan.swap`): its
computed blocks are copied to host memory, its device blocks are freed, and it waits with its
computed tokens intact. When the policy schedules it again, it takes as many device blocks,
its KV is copied back, and it continues where it stopped. The copies are not free: the step
that moves them lasts longer by the link's transfer time (`TransferLink`), hidden behind the
step's compute when the link overlaps it. The prefix tiers (`policylab.core.kv.tiers`) cross
the same link; the KV manager charges both to the step once (`KVManager.timed`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from policylab.core.kv.blocks import blocks_for

# (bandwidth in bytes/s one way, latency in s per transfer): effective one-direction rates.
LINK_PRESETS = {
    "pcie4": (25e9, 10e-6),       # PCIe 4.0 x16: 32 GB/s raw, about 25 GB/s achieved by pinned copies
    "pcie5": (50e9, 10e-6),       # PCIe 5.0 x16: 64 GB/s raw
    "nvlink_c2c": (450e9, 2e-6),  # Grace Hopper NVLink-C2C: 900 GB/s both directions together
}


@dataclass(frozen=True)
class TransferLink:
    """How long moving KV blocks between device and host takes, and whether it hides behind compute."""

    bandwidth: float          # bytes/s
    latency: float            # s per step that moves anything
    overlap: bool = False     # True: a step lasts max(compute, transfer); False: compute + transfer

    def transfer_time(self, num_blocks: int, block_bytes: float) -> float:
        return self.latency + num_blocks * block_bytes / self.bandwidth if num_blocks else 0.0

    def step_duration(self, compute: float, transfer: float) -> float:
        return max(compute, transfer) if self.overlap else compute + transfer


def make_link(preset: str, bandwidth: float | None, latency: float | None, overlap: bool) -> TransferLink:
    """A link from a preset name, with its bandwidth or latency overridden when given."""
    if preset not in LINK_PRESETS:
        raise ValueError(f"engine.swap_link must be one of {sorted(LINK_PRESETS)}, got '{preset}'")
    bw, lat = LINK_PRESETS[preset]
    bw = bw if bandwidth is None else bandwidth
    lat = lat if latency is None else latency
    if not 0 < bw < math.inf:
        raise ValueError(f"engine.swap_bandwidth must be a finite number of bytes/s > 0, got {bw}")
    if not 0 <= lat < math.inf:
        raise ValueError(f"engine.swap_latency must be a finite number of seconds >= 0, got {lat}")
    return TransferLink(float(bw), float(lat), bool(overlap))


class HostTier:
    """Host-memory KV blocks for swapped-out requests: a free list and each request's copy.

    `payload` is what the data plane exported (CPU tensors on the torch plane; None on the sim,
    which holds no KV contents).
    """

    def __init__(self, num_blocks: int):
        if num_blocks < 0:
            raise ValueError(f"engine.host_kv_blocks must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))   # popped from the end: lowest id first
        self._held: dict = {}                # req_id -> (host block ids, payload, tokens computed)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def holds(self, req_id: int) -> bool:
        return req_id in self._held

    def blocks_of(self, req_id: int) -> int:
        entry = self._held.get(req_id)
        return len(entry[0]) if entry else 0

    def tokens_of(self, req_id: int) -> int:
        """Computed tokens the request had when it was swapped out."""
        return self._held[req_id][2]

    def put(self, req_id: int, num_blocks: int, payload, num_tokens: int) -> None:
        if num_blocks > len(self._free):
            raise MemoryError(f"host KV tier exhausted: need {num_blocks} blocks, {len(self._free)} free")
        if req_id in self._held:
            raise ValueError(f"request {req_id} is already swapped out")
        blocks = [self._free.pop() for _ in range(num_blocks)]
        self._held[req_id] = (blocks, payload, num_tokens)

    def take(self, req_id: int):
        """Give the request's host blocks back; its payload."""
        blocks, payload, _ = self._held.pop(req_id)
        self._free.extend(reversed(blocks))
        return payload

    def swapped(self) -> dict:
        """req_id -> host block ids (read-only copy, for checks)."""
        return {rid: tuple(entry[0]) for rid, entry in self._held.items()}

    def check(self) -> None:
        held = [b for blocks, _, _ in self._held.values() for b in blocks]
        assert len(held) + len(self._free) == self.num_blocks, "host tier: used + free != total"
        assert len(set(held) | set(self._free)) == self.num_blocks, "host tier: a block is lost or counted twice"


SWAP_STATS = ("swap_outs", "swap_ins", "swapped_out_blocks", "swapped_in_blocks", "swap_in_cached_blocks",
              "transfer_time", "recomputed_tokens")


class SwapSpace:
    """The KV manager's swap strategy: the host tier, and the blocks moved over the link since the
    last executed step (their transfer is charged to the next one)."""

    def __init__(self, num_blocks: int, plane, stats: dict):
        self.host = HostTier(num_blocks)
        self.plane, self.stats, self.moved_blocks = plane, stats, 0

    def swap_out(self, r, block_size: int) -> None:
        """Copy a preempted request's computed blocks to the host tier (the KV manager then frees
        its device KV; it keeps its computed tokens and resumes exactly there)."""
        n = blocks_for(r.num_computed_tokens, block_size)
        payload = self.plane.export(r.block_table[:n])
        self.host.put(r.req_id, n, payload, r.num_computed_tokens)
        r.swapped_blocks = n
        self.moved_blocks += n
        self.stats["swap_outs"] += 1
        self.stats["swapped_out_blocks"] += n

    def swap_in(self, r, cached: int) -> None:
        """Copy a swapped request's KV from the host tier into the device blocks just taken for it;
        its first `cached` blocks were still in the device's prefix cache (taken as hits): not copied."""
        n, payload = r.swapped_blocks, self.host.take(r.req_id)
        if n > cached:
            self.plane.restore(r.block_table[cached:n], payload, cached)
        r.swapped_blocks = 0
        self.moved_blocks += n - cached
        self.stats["swap_ins"] += 1
        self.stats["swapped_in_blocks"] += n - cached
        self.stats["swap_in_cached_blocks"] += cached

    def drop(self, r) -> None:
        """A swapped request leaves without running again (rejected): its host blocks are freed."""
        self.host.take(r.req_id)
        r.swapped_blocks = 0
