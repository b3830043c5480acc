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
The per-client queues are kept across steps and updated with what changed (arrivals,
admissions, preemptions), so a step looks at the clients' heads, not the whole queue.
Generated tokens are charged when the policy next sees them (`view.sampled` at the next
step, or on_finished).
"""
from __future__ import annotations

from collections import Counter, defaultdict, deque
from itertools import repeat

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
        self._admitted: dict = {}               # req_id -> client, live requests admitted once
        self._admitted_per_client = Counter()   # client -> its requests in `_admitted`
        self._backlogged: set = set()
        self._last_left = 0.0
        self._queues: dict = defaultdict(deque)   # client -> its waiting req_ids, queue order
        self._client_of: dict = {}              # waiting req_id -> client
        self._leaving: list = []                # req_ids our last plan admitted
        self._entering: list = []               # req_ids our last plan preempted

    def weight(self, client: str) -> float:
        return float(self.weights.get(client, 1.0))

    def schedule(self, view: SchedulerView) -> StepPlan:
        self._update_queues(view)
        self._charge_outputs(view.sampled)
        self._update_backlog(view)
        plan = super().schedule(view)
        self._entering = list(plan.preempt)
        return plan

    def _update_queues(self, view: SchedulerView) -> None:
        """Apply what changed since the last step: our admissions, our preemptions (back in front,
        as the engine puts them), arrivals. Each client's queue keeps the waiting queue's order."""
        queues, client_of, by_id = self._queues, self._client_of, view.by_id
        for rid in self._leaving:                    # admitted: heads of their client's queue
            queue = queues[client_of.pop(rid)]
            if queue[0] == rid:
                queue.popleft()
            else:
                queue.remove(rid)
        for rid in reversed(self._entering):
            client = client_of[rid] = by_id[rid].client
            queues[client].appendleft(rid)
        for rid in view.arrived:
            client = client_of[rid] = by_id[rid].client
            queues[client].append(rid)
        self._leaving, self._entering = [], []
        if len(client_of) != len(view.waiting):       # (a plan the engine did not carry out as given)
            queues.clear()
            self._client_of = {v.req_id: v.client for v in view.waiting}
            for rid, client in self._client_of.items():
                queues[client].append(rid)

    def on_finished(self, v: RequestView) -> None:
        client = self._admitted.pop(v.req_id, None)
        if client is not None:         # it finished on the token it just got: not charged yet
            self._left(client)
            self.counters[client] += self.w_out * 1 / self.weight(client)

    def _charge_outputs(self, sampled) -> None:
        """Charge w_out for each token the last step gave a running request (one each), client by
        client: the same additions, in the same order per counter, as charging request by request."""
        admitted, counters = self._admitted, self.counters
        if len(self._admitted_per_client) == 1:    # one client's requests: count them, not each one's client
            tokens = sum(map(admitted.__contains__, sampled))
            per_client = [(next(iter(self._admitted_per_client)), tokens)] if tokens else []
        else:
            per_client = Counter(map(admitted.get, sampled)).items()
        for client, tokens in per_client:
            if client is not None:         # (None: finished, charged by on_finished)
                counter, charge = counters[client], self.w_out * 1 / self.weight(client)
                if counter.is_integer() and charge.is_integer() and abs(counter) + tokens * abs(charge) < 2 ** 53:
                    counters[client] = counter + tokens * charge      # whole numbers: exact at once
                    continue
                for _ in repeat(None, tokens):
                    counter += charge
                counters[client] = counter

    def _update_backlog(self, view: SchedulerView) -> None:
        queued = {client for client, queue in self._queues.items() if queue}
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
        queues, by_id = self._queues, view.by_id
        heads = {client: 0 for client, queue in queues.items() if queue}   # client -> its head's place
        while heads:
            client = min(heads, key=lambda c: (self.counters[c], by_id[queues[c][heads[c]]].arrival_time, c))
            yield by_id[queues[client][heads[client]]]
            heads[client] += 1
            if heads[client] == len(queues[client]):
                del heads[client]

    def on_admitted(self, v: RequestView, n: int) -> None:
        self._leaving.append(v.req_id)
        if v.req_id not in self._admitted:      # first admission: charge the prompt once
            self.counters[v.client] += self.w_in * v.prompt_len / self.weight(v.client)
            self._admitted[v.req_id] = v.client
            self._admitted_per_client[v.client] += 1

    def _left(self, client: str) -> None:
        """One of `client`'s admitted requests left (`_admitted_per_client` keeps no zero)."""
        count = self._admitted_per_client
        count[client] -= 1
        if not count[client]:
            del count[client]
