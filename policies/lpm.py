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
    properties = ("stall_free", "chunk_budget", "aging_bound")

    def __init__(self, name: str | None = None, chunk_size: int | None = 512, max_partial_prefills: int = 1,
                 aging_rate: float = 1000.0, preempt_mode: str = "recompute"):
        super().__init__(name or "lpm", chunk_size, max_partial_prefills, preempt_mode)
        if isinstance(aging_rate, bool) or not isinstance(aging_rate, (int, float)) or not 0 <= aging_rate < float("inf"):
            raise ValueError(f"{self.name}: aging_rate must be a finite number >= 0, got {aging_rate!r}")
        self.aging_rate = float(aging_rate)

    def base_key(self, v: RequestView) -> float:
        """Un-aged rank; lower is served first: the more tokens it would reuse, the sooner."""
        return -float(v.num_cached_tokens)

    def key(self, v: RequestView, now: float) -> tuple:
        return (self.base_key(v) - self.aging_rate * (now - v.arrival_time), v.arrival_time, v.req_id)

    def admission_order(self, view: SchedulerView):
        now = view.clock
        return sorted(view.waiting, key=lambda v: self.key(v, now))
