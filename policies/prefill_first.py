"""prefill_first — vLLM v0's default scheduler and nano-vLLM's (DESIGN §7).

Rule: admit waiting requests FCFS (head-of-line: stop at the first that does not fit)
while the token budget, the sequence cap (running included) and free KV blocks allow,
each with its whole remaining prompt. If any prefill was admitted the step is
prefill-only. Otherwise decode every running request in order; when KV blocks run
short, preempt the most recently started running request (recompute later), and the
request itself if nothing else is left.
A prompt longer than the whole token budget runs alone in budget-size chunks (vLLM v0
refuses such prompts at startup; chunking keeps every request servable instead).
`watermark` (vLLM v0's, default 0.01): an admission must leave int(watermark * total blocks)
blocks free, so that running requests have room to decode before anyone is preempted; a
prompt whose blocks exceed the whole cache less the watermark can never be admitted and is
rejected with the reason (v0 ignores it). Decodes ignore the watermark. 0 turns it off.
A request swapped out mid-decode (another policy's or a wrapper's `StepPlan.swap`; this one
recomputes) waits at the head of the queue and is swapped back in by a decode step, after the
running decodes, as vLLM v0 swaps in after decoding the running batch: a prefill step stops at
it, so no step mixes the two phases.
Sources: vLLM v0 `Scheduler._schedule_default`, `BlockSpaceManager.can_allocate` (the
watermark); nano-vLLM `Scheduler.schedule`.
"""
from __future__ import annotations

from policylab import Policy, SchedulerView, StepPlan
from policylab.core.kv import blocks_for


class PrefillFirst(Policy):
    def __init__(self, name: str | None = None, watermark: float = 0.01):
        super().__init__(name)
        if not isinstance(watermark, (int, float)) or isinstance(watermark, bool) or not 0 <= watermark < 1:
            raise ValueError(f"{self.name}: watermark must be a number in [0, 1), got {watermark!r}")
        self.watermark = watermark
        self._oversized = None       # req_id of a prompt longer than the budget, mid-prefill

    def schedule(self, view: SchedulerView) -> StepPlan:
        if self._oversized is not None:          # forget it once its prompt is done (or it left)
            v = view.by_id.get(self._oversized)
            if v is None or not v.is_prefill:
                self._oversized = None
        if view.waiting or self._oversized is not None:
            plan = self._prefills(view)
            if plan.num_scheduled_tokens or plan.reject:
                return plan
        return self._decodes(view)

    def _prefills(self, view: SchedulerView) -> StepPlan:
        plan, budget, free = StepPlan(), view.max_num_batched_tokens, view.num_free_blocks
        seqs = len(view.running)
        reserve = int(self.watermark * view.num_total_blocks)
        v = view.by_id.get(self._oversized)
        if v is not None and v.status == "running" and v.is_prefill:   # keep chunking it, alone
            n = min(v.remaining_tokens, budget)
            if view.blocks_needed(v, n) <= view.num_free_blocks:
                plan.num_scheduled_tokens[v.req_id] = n
            return plan
        for v in view.waiting:
            if seqs >= view.max_num_seqs or v.is_swapped and v.is_decode:   # the next decode step's
                break
            if reserve and blocks_for(v.num_tokens, view.block_size) > view.num_total_blocks - reserve:
                plan.reject[v.req_id] = (f"its {blocks_for(v.num_tokens, view.block_size)} KV blocks exceed the "
                                         f"cache less the watermark ({view.num_total_blocks} - {reserve})")
                continue
            n = v.remaining_tokens
            if n > view.max_num_batched_tokens and not plan.num_scheduled_tokens:
                n = budget                      # oversized prompt: first chunk, alone
            need = view.blocks_needed(v, n)
            if n > budget or need > free - reserve:
                break
            plan.num_scheduled_tokens[v.req_id] = n
            budget, free, seqs = budget - n, free - need, seqs + 1
            if n < v.remaining_tokens:
                self._oversized = v.req_id
                break
        return plan

    def _decodes(self, view: SchedulerView) -> StepPlan:
        free = view.num_free_blocks
        swapped = bool(view.waiting) and view.waiting[0].is_swapped and view.waiting[0].is_decode
        if len(view.decoding) == len(view.running) <= view.max_num_batched_tokens \
                and view.decode_blocks_needed <= free and not swapped:   # the steady state: every request decodes
            return StepPlan(view.decode_tokens())
        plan = StepPlan()
        running, head, tail = view.running, 0, len(view.running)
        budget = view.max_num_batched_tokens
        while head < tail and budget > 0:
            v = running[head]
            head += 1
            if v.req_id == self._oversized and v.is_prefill:   # waiting for KV to chunk on: no mixing
                continue
            need = view.blocks_needed(v, 1)
            while need > free and head < tail:
                tail -= 1                        # victim: the most recently started
                free += view.blocks_freed_by_preempting(running[tail])
                plan.preempt.append(running[tail].req_id)
            if need > free:
                plan.preempt.append(v.req_id)
                break
            plan.num_scheduled_tokens[v.req_id] = 1
            free, budget = free - need, budget - 1
        if swapped and not plan.preempt:
            self._swap_in(view, plan, free, budget)
        return plan

    def _swap_in(self, view: SchedulerView, plan: StepPlan, free: int, budget: int) -> None:
        """Swapped decoders at the head of the queue get their decode token, FCFS, while they fit."""
        seqs = len(view.running)
        for v in view.waiting:
            need = view.blocks_needed(v, 1)
            if not (v.is_swapped and v.is_decode) or seqs >= view.max_num_seqs or budget < 1 or need > free:
                return
            plan.num_scheduled_tokens[v.req_id] = 1
            free, budget, seqs = free - need, budget - 1, seqs + 1
