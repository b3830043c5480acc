"""priority — static priority classes with aging (DESIGN §7 family, vLLM's priority policy).

Rule: requests carry a class `priority` from the trace (lower value = served first, as in
vLLM). Waiting requests are admitted in order of the effective key
    key = base_key − aging_rate · (now − arrival),   base_key = priority,
FCFS among equal keys (arrival, then id), head-of-line (stop at the first that does not
fit). Running requests are served in key order; on KV shortage the running request with
the worst key is preempted (vLLM v1 preempts max(priority, arrival)). Batching is
`chunked` (decodes first in one `chunk_size` token budget), so only the order differs.
Aging prevents starvation: a request x is never passed by a request y arriving more than
(base_key(x) − base_key(y)) / aging_rate seconds after it (aging_rate in classes per
second; 0 disables aging and allows starvation).
Cost: the waiting order is kept across steps (sorted by base + rate·arrival, updated with
what changed), so a step looks only at the requests it admits, not at the whole queue.
Sources: vLLM `SchedulingPolicy.PRIORITY` (v1 `Scheduler`, `RequestQueue`); aging as in
Silberschatz et al., "Operating System Concepts", priority scheduling with aging.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from heapq import heappop, heappush
from itertools import chain

from policylab import RequestView, SchedulerView, StepPlan
from policies.chunked import Chunked


class Priority(Chunked):
    properties = ("stall_free", "chunk_budget", "aging_bound")

    def __init__(self, name: str | None = None, chunk_size: int | None = 512,
                 max_partial_prefills: int = 1, aging_rate: float = 0.1):
        super().__init__(name or "priority", chunk_size, max_partial_prefills)
        if not isinstance(aging_rate, (int, float)) or aging_rate < 0:
            raise ValueError(f"{self.name}: aging_rate must be a number >= 0, got {aging_rate!r}")
        self.aging_rate = float(aging_rate)
        self._queue: list = []          # (base + rate·arrival, arrival, req_id) of waiting requests, sorted
        self._entries: dict = {}        # req_id -> its entry in _queue
        self._leaving: set = set()      # req_ids our last plan admitted or rejected
        self._entering: list = []       # req_ids our last plan preempted (back to waiting)

    def base_key(self, v: RequestView) -> float:
        """Un-aged rank of a request; lower is served first."""
        return float(v.priority)

    def key(self, v: RequestView, now: float) -> tuple:
        return (self.base_key(v) - self.aging_rate * (now - v.arrival_time), v.arrival_time, v.req_id)

    def running_order(self, view: SchedulerView, running: list) -> list:
        return sorted(running, key=lambda v: self.key(v, view.clock))

    # ------------------------------------------------ the waiting order, kept across steps
    def schedule(self, view: SchedulerView) -> StepPlan:
        self._update_queue(view)
        plan = super().schedule(view)
        self._leaving.update(plan.reject)
        self._entering = list(plan.preempt)
        return plan

    def on_admitted(self, v: RequestView, n: int) -> None:
        self._leaving.add(v.req_id)

    def _entry(self, v: RequestView) -> tuple:
        """Aging lowers every waiting key at the same rate, so base + rate·arrival orders
        waiting requests at any time (a request's base does not change while it waits)."""
        return self.base_key(v) + self.aging_rate * v.arrival_time, v.arrival_time, v.req_id

    def _update_queue(self, view: SchedulerView) -> None:
        """Apply what changed since the last step: arrivals, our admissions, rejections, preemptions."""
        queue, by_id = self._queue, view.by_id
        for rid in self._leaving:
            del queue[bisect_left(queue, self._entries.pop(rid))]
        for rid in chain(view.arrived, self._entering):
            entry = self._entries[rid] = self._entry(by_id[rid])
            insort(queue, entry)
        self._leaving, self._entering = set(), []
        if len(queue) != len(view.waiting):          # (a plan the engine did not carry out as given)
            self._entries = {v.req_id: self._entry(v) for v in view.waiting}
            self._queue[:] = sorted(self._entries.values())

    def admission_order(self, view: SchedulerView):
        """Waiting requests by `key` at this step's clock: the kept order, with keys that equal to
        within float rounding (1e-9 relative) re-ranked by `key` itself, so the order is exactly
        `sorted(view.waiting, key=...)` while only the requests admitted are looked at."""
        now, by_id, queue = view.clock, view.by_id, self._queue
        shift, heap, i = self.aging_rate * now, [], 0
        while i < len(queue) or heap:
            while i < len(queue) and (not heap or queue[i][0] - shift <= heap[0][0][0] + 1e-9 * (
                    1.0 + abs(queue[i][0]) + abs(shift))):
                v = by_id[queue[i][2]]
                heappush(heap, (self.key(v, now), v))
                i += 1
            yield heappop(heap)[1]
