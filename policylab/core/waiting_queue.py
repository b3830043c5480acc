"""The waiting queue, and the read-only window on it that policies get (DESIGN §2 admit, §3).

Queue order is what it always was: requests put back by a preemption first (the latest
preemption first, as they are put back in front), then new arrivals in arrival order.
Under overload thousands of requests wait while a step starts a handful, so every change
costs in proportion to what changed: an arrival is appended, a start or a rejection
removes one entry (a dict deletion), a preemption prepends to a short list. Nothing is
rebuilt per step, and `QueueView` exposes the live queue to policies without a copy.
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, islice


class WaitingQueue:
    """Waiting requests by req_id: `_front` (requeued by preemption), then `_arrived` (arrival order)."""

    def __init__(self, views: dict):
        self._views = views          # req_id -> RequestView of every live request (the engine's)
        self._front: list = []       # req_ids put back by preemptions, queue order
        self._arrived: dict = {}     # req_id -> its arrival's sequence number, arrival order
        self._seq = 0
        self._holes = 0              # entries removed from `_arrived` since it was last compacted

    def append(self, rid: int) -> None:
        self._arrived[rid] = self._seq
        self._seq += 1

    def put_back(self, rids: list) -> None:
        """Preempted requests, in front of everything waiting, in the given order."""
        self._front[:0] = rids

    def remove(self, rids) -> None:
        """Started or rejected requests leave the queue."""
        front, arrived = set(), self._arrived
        for rid in rids:
            if rid in arrived:
                del arrived[rid]
                self._holes += 1
            else:
                front.add(rid)
        if front:
            self._front = [rid for rid in self._front if rid not in front]
        if self._holes > 256 and self._holes * self._holes > 32 * len(arrived):
            self._compact()

    def _compact(self) -> None:
        """A dict keeps a removed entry's slot until it grows: iterating it from the start walks
        every slot removed from its front, which under overload (tens of thousands waiting, the
        oldest starting first) costs more than the rest of a step. A copy keeps only the live
        entries, in order; done when the removed slots outgrow the square root of the queue's
        length (times 32), so copying and walking each cost O(sqrt(queue)) a removal."""
        self._arrived = dict(self._arrived)
        self._holes = 0

    def in_queue_order(self, rids) -> list:
        """`rids` (all waiting) sorted by their place in the queue."""
        arrived = self._arrived
        if not self._front:
            return sorted(rids, key=arrived.__getitem__)
        place = {rid: i for i, rid in enumerate(self._front)}
        return sorted(rids, key=lambda rid: (0, place[rid]) if rid in place else (1, arrived[rid]))

    def ids(self):
        return chain(self._front, self._arrived)

    def __len__(self) -> int:
        return len(self._front) + len(self._arrived)

    def __bool__(self) -> bool:          # (asked every step, by the engine and most policies)
        return bool(self._arrived or self._front)

    def __contains__(self, rid) -> bool:
        return rid in self._arrived or rid in self._front


class QueueView(Sequence):
    """Read-only, live sequence of the waiting requests' `RequestView`s, in queue order.

    Iterating, `len` and `bool` cost nothing per step; indexing walks the queue (use
    `view.waiting[0]` freely, but iterate rather than index in a loop)."""

    __slots__ = ("_queue",)

    def __init__(self, queue: WaitingQueue):
        self._queue = queue

    def __iter__(self):
        return map(self._queue._views.__getitem__, self._queue.ids())

    def __len__(self) -> int:
        return len(self._queue)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def __getitem__(self, index):
        if isinstance(index, slice):
            if index.step is None and (index.start or 0) >= 0 and (index.stop is None or index.stop >= 0):
                return tuple(islice(self, index.start, index.stop))
            return tuple(self)[index]
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError("waiting queue index out of range")
        return next(islice(self, i, None))

    def __reversed__(self):
        return reversed(tuple(self))

    def __eq__(self, other) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, (QueueView, list, tuple)) else other)

    __hash__ = None

    def __repr__(self) -> str:
        return f"QueueView({len(self)} waiting)"
