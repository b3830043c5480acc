"""decode_first — FasterTransformer-style request-level batching (DESIGN §7).

Rule: while any request runs, every running request decodes (in start order) and nothing
new is admitted; only when the batch has drained is a new batch formed, FCFS with whole
prompts while the token budget (max_num_batched_tokens), the sequence cap and free KV
blocks allow (head-of-line: stop at the first that does not fit). With
`admit_into_free_slots: true` new whole prompts also join a running batch, in the budget
and sequence slots its decodes leave free (Orca-style iteration-level admission), but
decodes are still served first and never paused.
KV shortage preempts the most recently started running request (recompute later);
FasterTransformer reserves KV for the whole output instead, which a paged cache does not.
A prompt longer than the whole token budget is admitted alone, in budget-size chunks.
Sources: NVIDIA FasterTransformer (static/request-level batching, GptDecoder); Yu et al.,
"Orca: A Distributed Serving System for Transformer-Based Generative Models", OSDI'22
(request- vs iteration-level scheduling, §2.2 and §4.2).
"""
from __future__ import annotations

from policylab import RequestView, SchedulerView
from policies.chunked import Chunked


class DecodeFirst(Chunked):
    def __init__(self, name: str | None = None, admit_into_free_slots: bool = False):
        super().__init__(name or "decode_first", chunk_size=None, max_partial_prefills=1)
        if not isinstance(admit_into_free_slots, bool):
            raise ValueError(f"{self.name}: admit_into_free_slots must be true or false, "
                             f"got {admit_into_free_slots!r}")
        self.admit_into_free_slots = admit_into_free_slots
        self.properties = ("stall_free",) if admit_into_free_slots else ("stall_free", "drained_admission")

    def admission_order(self, view: SchedulerView):
        if view.running and not self.admit_into_free_slots:
            return ()
        return view.waiting

    def new_chunk(self, view: SchedulerView, v: RequestView, budget: int, admitted: int) -> int:
        n = v.remaining_tokens
        if n <= budget:
            return n
        if n > view.max_num_batched_tokens and not admitted:
            return budget                 # oversized prompt: first chunk, alone among new ones
        return 0
