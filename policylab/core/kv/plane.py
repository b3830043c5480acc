"""The data plane's side of the KV manager: the K/V contents it holds, if any, and a block's bytes.

On a plane that holds real K/V (`Capability.KV_CONTENTS`: the torch plane) moving a block moves
its contents: swap and the prefix tiers copy them to CPU memory and back, forks copy a shared
block before it is written, P/D hands a prompt's K/V to another replica. On a plane that holds
none (the sim) the same moves are accounting only: every payload is None.
"""
from __future__ import annotations

from policylab.core.capabilities import Capability


class PlaneKV:
    def __init__(self, plane, block_size: int):
        caps = plane.capabilities
        self.name = type(plane).__name__
        self._plane = plane if Capability.KV_CONTENTS in caps else None
        self.block_bytes = float(plane.kv_block_bytes(block_size)) if Capability.KV_BYTES in caps else None

    @property
    def holds_contents(self) -> bool:
        return self._plane is not None

    def export(self, table: list):
        """A CPU copy of these blocks' K/V (None: the plane holds none)."""
        return None if self._plane is None else self._plane.export_kv(table).to("cpu")

    def restore(self, table: list, payload, first: int = 0) -> None:
        """Write an exported payload into these blocks (its blocks from `first` on)."""
        if payload is not None:
            self._plane.import_kv(table, payload, first)

    def copy(self, src: list, dst: list) -> None:
        """Copy blocks `src` into `dst`, pairwise (copy-on-write)."""
        if self._plane is not None and src:
            self._plane.copy_kv_blocks(src, dst)

    def equal(self, table: list, payload) -> bool:
        """Whether these blocks hold `payload` (checks of promoted blocks)."""
        return payload is None or self.export(table).equal(payload.to("cpu"))
