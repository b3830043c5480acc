"""fairness — Virtual Token Counter (VTC) fair scheduling (DESIGN §7).

Rule (Sheng et al., "Fairness in Serving Large Language Models", OSDI'24, Alg. 2): one
counter per client, `counters[c]` = service received / the client's weight. New requests
are admitted one at a time from the head of the backlogged client with the smallest
counter (FCFS inside a client; ties: earliest head, then name). Admission charges
w_in·prompt tokens, every generated token w_out (both divided by the client's weight).
A client is backlogged while it has a waiting request; when it becomes backlogged again
its counter is lifted to the minimum counter of the clients that stayed backlogged (to
the counter of the last client to leave when none did), so idling banks no credit.
Counters never decrease.
Batching is `chunked` (decodes first, one `chunk_size` token budget, tail preemption), so
the admission order is the only difference from it. A preempted request is recomputed
without a second prompt charge: recomputation is the system's cost, not service.
Generated tokens are charged when the policy next sees them (next step, or on_finished).
"""
from __future__ import annotations

from collections import defaultdict, deque

from policylab import RequestView, SchedulerView, StepPlan
from policies.chunked import Chunked


class Fairness(Chunked):
    properties = ("stall_free", "chunk_budget", "vtc")

    def __init__(self, name: str | None = None, chunk_size: int | None = 512,
                 max_partial_prefills: int = 1, w_in: float = 1.0, w_out: float = 2.0,
                 weights: dict | None = None):
        super().__init__(name or "fairness", chunk_size, max_partial_prefills)
        weights = dict(weights or {})
        for client, w in weights.items():
            if not isinstance(w, (int, float)) or w <= 0:
                raise ValueError(f"{self.name}: weight of client '{client}' must be > 0, got {w!r}")
        if w_in < 0 or w_out < 0:
            raise ValueError(f"{self.name}: w_in and w_out must be >= 0, got {w_in}, {w_out}")
        self.w_in, self.w_out, self.weights = float(w_in), float(w_out), weights
        self.counters: dict = defaultdict(float)
        self._outputs_charged: dict = {}        # req_id -> output tokens already charged
        self._backlogged: set = set()
        self._last_left = 0.0

    def weight(self, client: str) -> float:
        return float(self.weights.get(client, 1.0))

    def schedule(self, view: SchedulerView) -> StepPlan:
        for v in view.running:
            self._charge_outputs(v)
        self._update_backlog(view)
        return super().schedule(view)

    def on_finished(self, v: RequestView) -> None:
        if v.req_id in self._outputs_charged:
            self._charge_outputs(v)
            del self._outputs_charged[v.req_id]

    def _charge_outputs(self, v: RequestView) -> None:
        done = self._outputs_charged.get(v.req_id)
        if done is not None and v.num_output_tokens > done:
            self.counters[v.client] += self.w_out * (v.num_output_tokens - done) / self.weight(v.client)
            self._outputs_charged[v.req_id] = v.num_output_tokens

    def _update_backlog(self, view: SchedulerView) -> None:
        queued = {v.client for v in view.waiting}
        stayed = queued & self._backlogged
        left = self._backlogged - queued
        if left:
            self._last_left = min(self.counters[c] for c in left)
        if queued - stayed:
            floor = min(self.counters[c] for c in stayed) if stayed else self._last_left
            for c in queued - stayed:
                self.counters[c] = max(self.counters[c], floor)
        self._backlogged = queued

    def admission_order(self, view: SchedulerView):
        heads: dict = {}
        for v in view.waiting:
            heads.setdefault(v.client, deque()).append(v)
        while heads:
            client = min(heads, key=lambda c: (self.counters[c], heads[c][0].arrival_time, c))
            queue = heads[client]
            yield queue.popleft()
            if not queue:
                del heads[client]

    def on_admitted(self, v: RequestView, n: int) -> None:
        if v.req_id not in self._outputs_charged:      # first admission: charge the prompt once
            self.counters[v.client] += self.w_in * v.prompt_len / self.weight(v.client)
            self._outputs_charged[v.req_id] = v.num_output_tokens
