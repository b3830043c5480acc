"""shortest_prompt — decode all running requests, then admit the shortest waiting prompts.

The first policy of docs/policies.md, kept here as written: it FAILS the invariant harness (a prompt
longer than the whole token budget is never admitted, and it never preempts), which is
the point of that page's harness section. It lives in policylab/examples/, not policies/, so the
shipped-policy tests never pick it up.
"""
from policylab.core.contract import SchedulerView, StepPlan
from policylab.core.policy import Policy


class ShortestPrompt(Policy):
    def __init__(self, name=None, max_admit: int = 8):
        super().__init__(name)
        self.max_admit = max_admit

    def schedule(self, view: SchedulerView) -> StepPlan:
        plan = StepPlan()
        budget, free = view.max_num_batched_tokens, view.num_free_blocks
        for v in view.running:                      # decodes first: one token each
            need = view.blocks_needed(v, 1)
            if v.is_decode and need <= free and budget >= 1:
                plan.num_scheduled_tokens[v.req_id] = 1
                budget, free = budget - 1, free - need
        seqs = len(view.running)
        for v in sorted(view.waiting, key=lambda v: v.prompt_len)[:self.max_admit]:
            n, need = v.remaining_tokens, view.blocks_needed(v, v.remaining_tokens)
            if n <= budget and need <= free and seqs < view.max_num_seqs:
                plan.num_scheduled_tokens[v.req_id] = n
                budget, free, seqs = budget - n, free - need, seqs + 1
        return plan
