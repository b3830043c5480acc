"""Keep CPython's cyclic garbage collector off the replay's growing heap.

A replay keeps every request (tokens, timestamps, block tables) and every step record for the
metrics: millions of objects that are never garbage. CPython's full collections traverse all
of them again each time the heap grows by a quarter, a real share of a long replay. The engine makes next to no cyclic garbage (reference
counting frees it), so the replay moves what is alive to the collector's permanent generation
(`gc.freeze`) at the start and every `FREEZE_EVERY` finished requests: collections then look
only at what is newer. Frozen objects are still freed by reference counting; a reference cycle
that is still uncollected when a freeze comes is collected after the run, when the heap is
unfrozen (unless the caller had frozen objects itself: that choice, and all frozen since, stays).
"""
from __future__ import annotations

import gc

FREEZE_EVERY = 1000     # finished requests between freezes


class FrozenHeap:
    """Context manager around a replay loop; `freeze_if_due(num_done)` once per step."""

    def __enter__(self) -> "FrozenHeap":
        self._owner = gc.get_freeze_count() == 0     # else a caller froze objects: leave them so
        self._next = 0
        self.freeze_if_due(0)
        return self

    def freeze_if_due(self, num_done: int) -> None:
        if num_done >= self._next:
            gc.freeze()
            self._next = num_done + FREEZE_EVERY

    def __exit__(self, *exc) -> None:
        if self._owner:
            gc.unfreeze()        # back to the oldest generation: collectable again
