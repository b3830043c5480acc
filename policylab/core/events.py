"""The one event queue of a replay (Vidur's): every source of time, in one order (DESIGN §2).

Trace arrivals, closed-loop turns, tool returns, KV transfers between replicas and the steps of
the engines are all events: (time, rank, order, handler, argument), the earliest first. At one
instant arrivals (rank ARRIVAL: trace requests, session turns, tool results coming back) go
before other events (rank EVENT: KV transfers, hand-offs), and those before engine steps (rank
STEP, by replica index), so a request due at a step's start is admitted before it (DESIGN §2
step 1). Within a rank, events keep the order they were scheduled in. A single engine and a
cluster run the same queue; nothing else in a replay keeps time.

A source of many events (a trace of a million arrivals) keeps one entry in the queue at a time:
its handler schedules the next one (`ArrivalSource`), so the queue stays as small as what is
pending now.
"""
from __future__ import annotations

import math
from heapq import heappop, heappush
from typing import Callable

INF = math.inf
ARRIVAL, EVENT, STEP = 0, 1, 2


class EventQueue:
    __slots__ = ("_heap", "_sequence")

    def __init__(self):
        self._heap: list = []
        self._sequence = 0

    def push(self, time: float, rank: int, handler: Callable, arg=None, order: int | None = None) -> None:
        """Schedule `handler(arg, time)`. `order` breaks ties within a rank (default: scheduling order)."""
        self._sequence += 1
        heappush(self._heap, (time, rank, self._sequence if order is None else order, self._sequence, handler, arg))

    def next_time(self) -> float:
        """When the earliest event is due (INF: none is scheduled)."""
        return self._heap[0][0] if self._heap else INF

    def pop(self) -> tuple:
        """(time, handler, arg) of the earliest event, taken off the queue."""
        time, _, _, _, handler, arg = heappop(self._heap)
        return time, handler, arg

    def run_due(self, now: float) -> bool:
        """Handle every event due at or before `now`, in order (each may schedule more); whether any ran."""
        heap, ran = self._heap, False
        while heap and heap[0][0] <= now:
            time, _, _, _, handler, arg = heappop(heap)
            handler(arg, time)
            ran = True
        return ran

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)


class ArrivalSource:
    """The arrivals of a trace sorted by time, fed to the queue one at a time: each, when handled,
    calls `arrive(i)` and schedules the next."""

    __slots__ = ("queue", "trace", "arrive", "next")

    def __init__(self, queue: EventQueue, trace: list, arrive: Callable[[int], None], start: int = 0):
        self.queue, self.trace, self.arrive, self.next = queue, trace, arrive, start
        self._schedule()

    def _schedule(self) -> None:
        if self.next < len(self.trace):
            self.queue.push(self.trace[self.next].arrival_time, ARRIVAL, self._handle, self.next)

    def _handle(self, i: int, _time: float) -> None:
        self.next = i + 1
        self.arrive(i)
        if self.next < len(self.trace):        # (`_schedule`, inline: once a request)
            self.queue.push(self.trace[self.next].arrival_time, ARRIVAL, self._handle, self.next)

    @property
    def exhausted(self) -> bool:
        return self.next >= len(self.trace)
