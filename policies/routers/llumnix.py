"""llumnix — Llumnix's global scheduler: dispatch to the freest replica, and rebalance running
requests between replicas by live migration.

Each replica's *freeness* is Llumnix's virtual-usage load: the KV blocks it has free, less those its
queued prompts will take, per running request (`freeness`). An arrival goes to the freest replica.
Every `interval` seconds the replicas whose freeness is below `migrate_out_below` (preemptions and
queueing coming: too little KV headroom per request, or a queue of prompts that do not fit) are
paired, the least free first, with the freest replicas above `migrate_in_above`; each pair moves one
request, the source's decoding request of lowest priority (the highest `priority` value) and, among those, the fewest KV blocks
(the cheapest move), with `policylab.cluster.migration`'s live migration (stages while it decodes,
then a short stop-and-copy). `migrate=false` is the same dispatch without migration: the baseline
that isolates what migration does.

Source: Sun et al., "Llumnix: Dynamic Scheduling for Large Language Model Serving" (OSDI'24), §4.2
(migration), §4.4 (virtual usage, freeness, dispatch and migration pairing).
"""
from __future__ import annotations

from typing import Optional

from policylab import ClusterView, Migration, RouteRequest, Router


def freeness(replica) -> float:
    """Free KV blocks after the queued prompts take theirs, per running request (Llumnix's F)."""
    queued = -(-replica.outstanding_prefill_tokens // replica.block_size)
    return (replica.num_free_blocks - queued) / max(replica.num_running, 1)


class Llumnix(Router):
    def __init__(self, name: str = "llumnix", seed: int = 0, migrate: bool = True, interval: float = 0.05,
                 migrate_out_below: float = 1.0, migrate_in_above: float = 4.0, stop_copy_blocks: int = 1,
                 max_stages: int = 8):
        super().__init__(name, seed)
        if interval <= 0 or migrate_in_above < migrate_out_below:
            raise ValueError(f"router llumnix: interval must be > 0 and migrate_in_above >= migrate_out_below, "
                             f"got {interval}, {migrate_in_above}, {migrate_out_below}")
        self.rebalance_interval: Optional[float] = float(interval) if migrate else None
        self.migrate_out_below, self.migrate_in_above = migrate_out_below, migrate_in_above
        self.stop_copy_blocks, self.max_stages = stop_copy_blocks, max_stages

    def route(self, request: RouteRequest, view: ClusterView) -> int:
        return max(view.replicas, key=lambda r: (freeness(r), -r.index)).index

    def rebalance(self, view: ClusterView) -> list:
        ranked = sorted(view.replicas, key=lambda r: (freeness(r), r.index))
        sources = [r for r in ranked if freeness(r) < self.migrate_out_below]
        destinations = [r for r in reversed(ranked) if freeness(r) > self.migrate_in_above]
        moves = []
        for source, destination in zip(sources, destinations):
            if source.index == destination.index:
                break
            candidates = [q for q in source.running_requests if q.decoding and q.req_id not in view.migrating]
            if any(q.req_id in view.migrating for q in source.running_requests):
                continue                          # (one move out of a replica at a time)
            if candidates:
                pick = min(candidates, key=lambda q: (-q.priority, q.num_blocks, q.req_id))   # (lower value: served first)
                moves.append(Migration(pick.req_id, source.index, destination.index))
        return moves
