"""plas — program-level least attained service (Autellix's PLAS), for agents that call tools.

Rule: a program is a request with all its LLM calls: the segments between its tool calls.
Its attained service is every token the policy has scheduled for it so far, over all its
calls (prefill, decode, the tools' tokens and any recompute), kept across its tool pauses
instead of starting afresh with each call. Programs are ranked by level: 0 below
`quantum` tokens, then one level per doubling (level k holds service in
[quantum·2^(k-1), quantum·2^k)), at most `num_levels` − 1. Waiting requests are admitted
lowest level first, earliest program arrival within a level (head-of-line: stop at the
first that does not fit); on KV shortage the running request of the highest level, latest
arrival among equals, is preempted first. Batching is `chunked`'s (decodes first, one
`chunk_size` budget). So short programs and programs early in their life overtake long
ones, which approximates shortest-job-first without knowing any job's length; discrete
levels keep programs of similar service in FCFS order instead of thrashing between them.
At a tool call its KV is handled by the default rule of `Policy.on_tool_call` (offload
when the host tier has room, else keep while nobody waits, else free): keeping it would hold
memory while programs with less service are admitted ahead of it (docs/tool-calls.md).
Sources: Luo et al., "Autellix: An Efficient Serving Engine for LLM Agents as General
Programs", 2025 (§4.2 PLAS, discretized multi-level queues); Abdelkader et al., InferCept
(ICML'24) for the KV choice at a call.
"""
from __future__ import annotations

import math
from collections import Counter
from operator import countOf
from typing import Iterable

from policylab import RequestView, SchedulerView, StepPlan
from policies.chunked import Chunked


class ProgramLeastAttainedService(Chunked):
    def __init__(self, name: str | None = None, chunk_size: int | None = 512,
                 max_partial_prefills: int = 1, quantum: int = 512, num_levels: int = 8):
        super().__init__(name or "plas", chunk_size, max_partial_prefills)
        if type(quantum) is not int or quantum < 1:
            raise ValueError(f"{self.name}: quantum must be an int >= 1 (tokens), got {quantum!r}")
        if type(num_levels) is not int or num_levels < 1:
            raise ValueError(f"{self.name}: num_levels must be an int >= 1, got {num_levels!r}")
        self.quantum, self.num_levels = quantum, num_levels
        self.service: Counter = Counter()   # req_id -> tokens scheduled for it so far, all its calls

    def level(self, v: RequestView) -> int:
        s = self.service.get(v.req_id, 0)
        if s < self.quantum:
            return 0
        return min(int(math.log2(s / self.quantum)) + 1, self.num_levels - 1)

    def _rank(self, v: RequestView) -> tuple:
        return self.level(v), v.arrival_time, v.req_id

    def schedule(self, view: SchedulerView) -> StepPlan:
        plan = super().schedule(view)
        sched, service = plan.num_scheduled_tokens, self.service
        if countOf(sched.values(), 1) == len(sched):        # one token each (decodes): counted at once
            service.update(sched.keys())
            return plan
        for rid, n in sched.items():     # (the engine runs a valid plan as given)
            service[rid] = service.get(rid, 0) + n
        return plan

    def admission_order(self, view: SchedulerView) -> Iterable[RequestView]:
        return sorted(view.waiting, key=self._rank)

    def running_order(self, view: SchedulerView, running: list) -> list:
        return sorted(running, key=self._rank)

    def on_finished(self, v: RequestView) -> None:
        self.service.pop(v.req_id, None)

