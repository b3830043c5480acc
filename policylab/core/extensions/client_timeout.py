"""Clients that give up: a request not finished `timeout` seconds after it arrived is abandoned.

Load generators time requests out (`vllm bench serve`'s and inference-perf's clients do), and
under overload most requests end that way: the measured latencies cover only the survivors.
Replayed with the same timeout, an abandoned request ends rejected with the reason "abandoned by
its client after T s", its KV freed at that moment as a server frees an aborted request's, so
an overloaded run compares with the real one at all (`trace.client_timeout`). Under closed-loop
clients an abandoned turn is a rejected one: it ends its session, and a closed-loop user (a load
generator's slot) sends its next request at the moment it gave up.
"""
from __future__ import annotations

from policylab.core.extension import Extension
from policylab.core.result import Setting


class ClientTimeout(Extension):
    name = "client_timeout"
    schedules_events = True

    def __init__(self, timeout: float):
        if not 0 < timeout < float("inf"):
            raise ValueError(f"trace.client_timeout must be a finite number of seconds > 0, got {timeout!r}")
        self.timeout = float(timeout)
        self.stats = {"abandoned": 0, "timeout_s": Setting(self.timeout)}

    def section(self) -> dict:
        return self.stats

    def on_arrival(self, r) -> None:
        self.ops.schedule(r.arrival_time + self.timeout, self._expire, r.req_id)

    def _expire(self, req_id: int, _time: float) -> None:
        if self.ops.abort(req_id, f"abandoned by its client after {self.timeout:g} s"):
            self.stats["abandoned"] += 1
