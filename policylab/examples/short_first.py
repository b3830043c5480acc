"""short_first — Sarathi-Serve chunked batching that admits the shortest prompts first.

`Chunked` does the stall-free decodes, the chunking, the KV checks and the preemption;
a subclass changes only the order. A request waiting longer than `max_wait` seconds goes
ahead of the short ones, so long prompts never starve.
"""
from policies.chunked import Chunked


class ShortFirst(Chunked):
    properties = ("stall_free", "chunk_budget")        # checked by the invariant harness

    def __init__(self, name=None, chunk_size: int = 512, max_wait: float = 2.0):
        super().__init__(name or "short_first", chunk_size)
        self.max_wait = max_wait

    def admission_order(self, view):
        overdue = [v for v in view.waiting if view.clock - v.arrival_time > self.max_wait]
        rest = [v for v in view.waiting if view.clock - v.arrival_time <= self.max_wait]
        return overdue + sorted(rest, key=lambda v: v.prompt_len)
