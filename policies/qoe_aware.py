"""qoe_aware — token delivery paced to each user's reading, after Andes (Liu et al., "Andes: Defining
and Enhancing Quality-of-Experience in LLM-Based Text Streaming Services", arXiv 2404.16283, §4).

A user reads a streamed answer no faster than `expected_tds` tokens/s and expects the first token
within `expected_ttft` s (the run's `qoe.*`, the same numbers the QoE metric uses). So each
request has a deadline for its next token: its arrival + expected_ttft before its first token;
afterwards the moment the user will have read every token delivered so far (token i is read at
max(its arrival, the previous one's reading + 1/tds)). Its slack is that deadline − now: a
request far ahead of its reader has seconds of buffered text, one behind has none.

Rule: the waiting queue is served earliest deadline first, and running requests are ordered the
same way, so KV shortage preempts the request with the most buffered text first. When a waiting
request cannot start (no sequence slot or KV for its first chunk) and running requests hold more
than `min_buffer_s` of unread text beyond the waiting request's deadline, the step preempts such
running requests, most buffered first, up to `max_preempt` per step: their users keep reading
while a request that has shown nothing yet gets its first token (Andes' preemption of requests
with "sufficient" service). A preempted request is swapped to the host tier when there is room
(`engine.host_kv_blocks`; else recomputed) and comes back when its deadline is the earliest. It
can be chosen again only after it has received new tokens (its buffer only grows by receiving
them), so every preemption follows progress and a finite trace drains; `preemption_cap` bounds
how often one request may be preempted to make room (Andes' guard against thrashing; null: no
bound). Batching is `chunked`'s.
Andes chooses the served set by a knapsack over each request's QoE gain per unit of memory; this
rule keeps its two effects (first tokens before buffered ones, preempt whoever reads slowest
relative to what they have) without solving one each step.
"""
from __future__ import annotations

from policylab import RequestView, SchedulerView, StepPlan
from policies.chunked import Chunked


class QoeAware(Chunked):
    properties = ("stall_free", "chunk_budget")

    def __init__(self, name: str | None = None, chunk_size: int | None = 512, max_partial_prefills: int = 1,
                 preempt_mode: str = "swap", expected_ttft: float = 1.0, expected_tds: float = 5.0,
                 min_buffer_s: float = 2.0, max_preempt: int = 4, preemption_cap: int | None = None):
        super().__init__(name or "qoe_aware", chunk_size, max_partial_prefills, preempt_mode)
        if not (isinstance(expected_ttft, (int, float)) and expected_ttft >= 0):
            raise ValueError(f"{self.name}: expected_ttft must be >= 0 seconds, got {expected_ttft!r}")
        if not (isinstance(expected_tds, (int, float)) and expected_tds > 0):
            raise ValueError(f"{self.name}: expected_tds must be > 0 tokens/s, got {expected_tds!r}")
        if not (isinstance(min_buffer_s, (int, float)) and min_buffer_s >= 0):
            raise ValueError(f"{self.name}: min_buffer_s must be >= 0 seconds, got {min_buffer_s!r}")
        if type(max_preempt) is not int or max_preempt < 0:
            raise ValueError(f"{self.name}: max_preempt must be an int >= 0, got {max_preempt!r}")
        if preemption_cap is not None and (type(preemption_cap) is not int or preemption_cap < 0):
            raise ValueError(f"{self.name}: preemption_cap must be an int >= 0 or null, got {preemption_cap!r}")
        self.preemption_cap = preemption_cap
        # a victim goes to the host tier where it has room, else it recomputes; qoe_aware swaps by
        # default, so it runs without a host tier too and declares no feature (where chunked's
        # preempt_mode=swap, asked for explicitly, declares `swap` and is refused without one)
        self.features = ()
        self.ttft, self.pace = float(expected_ttft), 1.0 / expected_tds
        self.min_buffer, self.max_preempt = float(min_buffer_s), max_preempt
        self.read: dict = {}          # req_id -> (output tokens seen, when the user reads the last of them)

    def deadline(self, v: RequestView) -> float:
        """When this request's user needs its next token."""
        seen = self.read.get(v.req_id)
        return v.arrival_time + self.ttft if seen is None else seen[1] + self.pace

    def _key(self, v: RequestView) -> tuple:
        return self.deadline(v), v.arrival_time, v.req_id

    def admission_order(self, view: SchedulerView):
        return sorted(view.waiting, key=self._key)

    def running_order(self, view: SchedulerView, running: list) -> list:
        return sorted(running, key=self._key)

    def on_finished(self, v: RequestView) -> None:
        self.read.pop(v.req_id, None)

    def schedule(self, view: SchedulerView) -> StepPlan:
        self._note_tokens(view)
        plan = self._make_room(view) if view.waiting and self.max_preempt else None
        return plan if plan is not None else super().schedule(view)

    def _note_tokens(self, view: SchedulerView) -> None:
        """Advance each sampled request's reading clock by its new tokens (one read every 1/tds s)."""
        read, by_id, pace = self.read, view.by_id, self.pace
        for rid in view.sampled:
            v = by_id.get(rid)
            if v is None or v.last_token_time is None:
                continue
            seen, last = read.get(rid, (0, None))
            new = v.num_output_tokens - seen
            if new <= 0:
                continue
            t = v.last_token_time
            start = t if last is None else max(t, last + pace)
            read[rid] = (v.num_output_tokens, start + (new - 1) * pace)

    def _make_room(self, view: SchedulerView) -> StepPlan | None:
        """A plan that preempts buffered running requests for a waiting one that cannot start, or
        None (the step is chunked's)."""
        head = min(view.waiting, key=self._key)
        if head.is_swapped:
            return None                       # (it comes back by swap-in: chunked's own path)
        first = min(head.remaining_tokens, self.token_budget(view))
        slots = len(view.running) < view.max_num_seqs
        if slots and view.blocks_needed(head, first) + view.decode_blocks_needed <= view.num_free_blocks:
            return None                       # it can start: nothing to preempt
        due = self.deadline(head)
        decoding = view.decoding
        cap = self.preemption_cap
        buffered = [v for v in view.running if v.req_id in decoding and (cap is None or v.num_preemptions < cap)
                    and self.deadline(v) - max(view.clock, due) > self.min_buffer]
        if not buffered:
            return None
        buffered.sort(key=self._key, reverse=True)        # most unread text first
        plan = StepPlan(view.decode_tokens())
        host_free = view.num_free_host_blocks if self.preempt_mode == "swap" else 0
        freed, need = 0, view.blocks_needed(head, first) + view.decode_blocks_needed - view.num_free_blocks
        for v in buffered[:self.max_preempt]:
            del plan.num_scheduled_tokens[v.req_id]
            plan.preempt.append(v.req_id)
            if host_free and view.host_blocks_needed(v) <= host_free:
                plan.swap.append(v.req_id)
                host_free -= view.host_blocks_needed(v)
            freed += view.blocks_freed_by_preempting(v)
            if freed >= need and (slots or len(plan.preempt) >= 1):
                break
        needed, available = view.plan_kv(plan)
        return plan if needed <= available else None
