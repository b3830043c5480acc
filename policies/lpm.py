"""lpm — longest prefix match first (SGLang's cache-aware policy), with aging.

Rule: waiting requests are admitted in order of the effective key
    key = −cached_tokens − aging_rate · (now − arrival),
where cached_tokens is what the prefix cache would serve the request if it started now
(`RequestView.num_cached_tokens`: hits change as the cache changes, so the order is rebuilt
every step). The request that reuses the most KV goes first, which raises the hit rate
under load: its prefix is reused before eviction takes it. FCFS among equal keys,
head-of-line admission, `chunked` batching (decodes first in one `chunk_size` budget) and
tail preemption, recompute or swap (`preempt_mode`).
Aging bounds starvation: a request x is never passed by a request y arriving more than
(cached(y) − cached(x)) / aging_rate seconds after it (aging_rate in tokens per second;
0 disables aging, and a request with no hits can then wait for ever behind a stream of
requests that hit).
`max_wait_s` (null: off) is a second, absolute bound, shared with `dfs_weight`: a request that
has waited longer than max_wait_s seconds since it arrived is overdue, and overdue requests are
admitted first, FCFS (arrival, then id), ahead of the prefix-match order. An overdue request is
then passed only by requests that arrived before it (harness property `max_wait`).
Cost: each step sorts the waiting queue by its current hits (a lookup per waiting request
whenever the cache changed); SGLang falls back to FCFS past 128 waiting requests, this policy
does not.
Sources: Zheng et al., "SGLang: Efficient Execution of Structured Language Model Programs",
NeurIPS'24 §3 (cache-aware scheduling, longest-prefix-match order); SGLang
`schedule_policy.py` (`lpm`).
"""
from __future__ import annotations

from policylab import RequestView, SchedulerView
from policies.chunked import Chunked


class LongestPrefixMatch(Chunked):
    properties = ("stall_free", "chunk_budget", "aging_bound", "max_wait")

    def __init__(self, name: str | None = None, chunk_size: int | None = 512, max_partial_prefills: int = 1,
                 aging_rate: float = 1000.0, preempt_mode: str = "recompute", max_wait_s: float | None = None):
        super().__init__(name or "lpm", chunk_size, max_partial_prefills, preempt_mode)
        if isinstance(aging_rate, bool) or not isinstance(aging_rate, (int, float)) or not 0 <= aging_rate < float("inf"):
            raise ValueError(f"{self.name}: aging_rate must be a finite number >= 0, got {aging_rate!r}")
        self.aging_rate = float(aging_rate)
        self.max_wait_s = checked_max_wait(self.name, max_wait_s)

    def base_key(self, v: RequestView) -> float:
        """Un-aged rank; lower is served first: the more tokens it would reuse, the sooner."""
        return -float(v.num_cached_tokens)

    def key(self, v: RequestView, now: float) -> tuple:
        return (self.base_key(v) - self.aging_rate * (now - v.arrival_time), v.arrival_time, v.req_id)

    def admission_order(self, view: SchedulerView):
        now = view.clock
        overdue, rest = split_overdue(view, self.max_wait_s)
        return overdue + sorted(rest, key=lambda v: self.key(v, now))


def checked_max_wait(policy: str, value) -> float | None:
    """`max_wait_s` as a float, or None (no bound); anything else is refused with its name."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise ValueError(f"{policy}: max_wait_s must be null or a finite number of seconds >= 0, got {value!r}")
    return float(value)


def is_overdue(view: SchedulerView, v: RequestView, max_wait_s: float | None) -> bool:
    """Waited longer than max_wait_s since arrival (the one test the policies and the harness share)."""
    return max_wait_s is not None and view.clock - v.arrival_time > max_wait_s


def split_overdue(view: SchedulerView, max_wait_s: float | None) -> tuple:
    """(overdue waiting requests FCFS by arrival then id, the others in queue order)."""
    if max_wait_s is None:
        return [], list(view.waiting)
    overdue, rest = [], []
    for v in view.waiting:
        (overdue if is_overdue(view, v, max_wait_s) else rest).append(v)
    overdue.sort(key=lambda v: (v.arrival_time, v.req_id))
    return overdue, rest
