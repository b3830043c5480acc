"""Swap preemption's host tier and the link KV crosses to reach it.

A plan may preempt a running request by swap instead of recompute (`StepPlan.swap`): its
computed blocks are copied to host memory, its device blocks are freed, and it waits with its
computed tokens intact. When the policy schedules it again, it takes as many device blocks,
its KV is copied back, and it continues where it stopped. The copies are not free: the step
that moves them lasts longer by the link's transfer time (`TransferLink`), hidden behind the
step's compute when the link overlaps it.
"""
from __future__ import annotations

from dataclasses import dataclass

from policylab.core.batch import StepResult

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
    if not 0 < bw < float("inf"):
        raise ValueError(f"engine.swap_bandwidth must be a finite number of bytes/s > 0, got {bw}")
    if not 0 <= lat < float("inf"):
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


class Swapper:
    """The engine's side of swap preemption: the host tier, the link, the blocks moved since the
    last executed step (their transfer is charged to the next one) and the run's counters."""

    def __init__(self, cfg, dataplane):
        self.host = HostTier(cfg.host_kv_blocks)
        self.link = make_link(cfg.swap_link, cfg.swap_bandwidth, cfg.swap_latency, cfg.swap_overlap)
        self.dataplane, self.block_bytes, self.moved_blocks = dataplane, 0.0, 0
        if cfg.host_kv_blocks:
            if not hasattr(dataplane, "kv_block_bytes"):
                raise ValueError(f"engine.host_kv_blocks={cfg.host_kv_blocks}: data plane "
                                 f"{type(dataplane).__name__} cannot say how many bytes a KV block holds")
            self.block_bytes = float(dataplane.kv_block_bytes(cfg.block_size))
        self.stats = {"swap_outs": 0, "swap_ins": 0, "swapped_out_blocks": 0, "swapped_in_blocks": 0,
                      "swap_in_cached_blocks": 0, "transfer_time": 0.0, "recomputed_tokens": 0}

    def swap_out(self, r, block_size: int) -> None:
        """Copy a preempted request's computed blocks to the host tier (the engine then frees its
        device KV; it keeps its computed tokens and resumes exactly there)."""
        n = -(-r.num_computed_tokens // block_size)
        export = getattr(self.dataplane, "export_kv", None)
        payload = export(r.block_table[:n]).to("cpu") if export is not None else None
        self.host.put(r.req_id, n, payload, r.num_computed_tokens)
        r.swapped_blocks = n
        self.moved_blocks += n
        self.stats["swap_outs"] += 1
        self.stats["swapped_out_blocks"] += n

    def swap_in(self, r, cached: int) -> None:
        """Copy a swapped request's KV from the host tier into the device blocks just taken for it;
        its first `cached` blocks were still in the device's prefix cache (taken as hits): not copied."""
        n, payload = r.swapped_blocks, self.host.take(r.req_id)
        if payload is not None and n > cached:
            self.dataplane.import_kv(r.block_table[cached:n], payload, cached)
        r.swapped_blocks = 0
        self.moved_blocks += n - cached
        self.stats["swap_ins"] += 1
        self.stats["swapped_in_blocks"] += n - cached
        self.stats["swap_in_cached_blocks"] += cached

    def drop(self, r) -> None:
        """A swapped request leaves without running again (rejected): its host blocks are freed."""
        self.host.take(r.req_id)
        r.swapped_blocks = 0

    def with_transfer(self, result: StepResult) -> StepResult:
        """The step's result with the swap copies' transfer time in its duration."""
        transfer = self.link.transfer_time(self.moved_blocks, self.block_bytes)
        self.moved_blocks = 0
        self.stats["transfer_time"] += transfer
        return StepResult(result.sampled, self.link.step_duration(result.duration, transfer), result.accepted)
