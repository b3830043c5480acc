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
Sources: vLLM `SchedulingPolicy.PRIORITY` (v1 `Scheduler`, `RequestQueue`); aging as in
Silberschatz et al., "Operating System Concepts", priority scheduling with aging.
"""
from __future__ import annotations

from policylab import RequestView, SchedulerView
from policies.chunked import Chunked


class Priority(Chunked):
    properties = ("stall_free", "chunk_budget", "aging_bound")

    def __init__(self, name: str | None = None, chunk_size: int | None = 512,
                 max_partial_prefills: int = 1, aging_rate: float = 0.1):
        super().__init__(name or "priority", chunk_size, max_partial_prefills)
        if not isinstance(aging_rate, (int, float)) or aging_rate < 0:
            raise ValueError(f"{self.name}: aging_rate must be a number >= 0, got {aging_rate!r}")
        self.aging_rate = float(aging_rate)

    def base_key(self, v: RequestView) -> float:
        """Un-aged rank of a request; lower is served first."""
        return float(v.priority)

    def key(self, v: RequestView, now: float) -> tuple:
        return (self.base_key(v) - self.aging_rate * (now - v.arrival_time), v.arrival_time, v.req_id)

    def running_order(self, view: SchedulerView) -> list:
        return sorted(view.running, key=lambda v: self.key(v, view.clock))

    def admission_order(self, view: SchedulerView) -> list:
        return sorted(view.waiting, key=lambda v: self.key(v, view.clock))
