"""Baselines the papers compare against that no shipped policy is: built on `chunked`, passed to a
replay as a class (`Context.replay(policy_class=...)`)."""
from __future__ import annotations

from policies.chunked import Chunked


class CallFcfs(Chunked):
    """vLLM's order for agent programs: each LLM call is a request of its own, first come first served
    by when the call reached the server, so a program whose tool returned joins the back of the queue
    (the engine's own FCFS puts a resumed request in front, as a preempted one); preempted requests
    keep their place. Batching is `chunked`'s."""

    def __init__(self, name: str | None = None, chunk_size: int | None = 512):
        super().__init__(name or "call_fcfs", chunk_size)
        self.entered: dict = {}        # req_id -> when its current call reached the queue

    def schedule(self, view):
        for rid in view.arrived:       # new requests and resumed calls (a preempted request is not an arrival)
            self.entered[rid] = view.clock
        return super().schedule(view)

    def admission_order(self, view):
        return sorted(view.waiting, key=lambda v: (self.entered.get(v.req_id, v.arrival_time), v.req_id))

    def on_finished(self, v) -> None:
        self.entered.pop(v.req_id, None)
