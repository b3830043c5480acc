"""The invariants of speculative steps (DESIGN §8), checked after every step by `StepChecker`.

A plan's drafts never exceed what the request may still emit (k <= max_tokens − outputs − 1, the
cap a policy can know) and a verification never emits more than k + 1 tokens nor more than the
request's hidden output length; per step, accepted + rejected = proposed in the engine's
counters, and every draft the batch carried is counted; after the step a request that
speculated holds exactly the blocks of its computed tokens (the rejected drafts' KV released),
so nothing is left at drain. Tokens emitted by one verification share the step's end time.
"""
from __future__ import annotations

from policylab.core.kv import blocks_for


class SpecChecks:
    def __init__(self, checker):
        self.checker = checker
        self.stats: dict | None = None     # the engine's counters before this step
        self.shared_times: dict = {}       # req_id -> its tokens that share a time with the one before

    def check_step(self, engine, batch, snaps: dict, plan) -> dict:
        """Batch row -> (drafts verified, tokens the request gained) for each verification row."""
        fail, spec = self.checker.fail, engine.extension("speculation")
        before, now = self.stats or dict.fromkeys(spec.stats, 0), dict(spec.stats)
        self.stats = now
        delta = {key: now[key] - before[key] for key in now}
        if delta["accepted_tokens"] + delta["rejected_tokens"] != delta["proposed_tokens"]:
            fail("speculation", f"accepted {delta['accepted_tokens']} + rejected {delta['rejected_tokens']} "
                 f"!= proposed {delta['proposed_tokens']} draft tokens this step")
        lens = batch.spec_lens
        if not lens:
            if delta["proposed_tokens"]:
                fail("speculation", "drafts counted for a step that verified none")
            return {}
        if sum(lens) != delta["proposed_tokens"]:
            fail("speculation", f"the batch verified {sum(lens)} drafts, the engine counted "
                 f"{delta['proposed_tokens']}")
        planned = plan.spec_tokens if plan is not None else {}
        done = {}
        for row, (rid, k) in enumerate(zip(batch.req_ids, lens)):
            if not k:
                continue
            r, s = engine.requests[rid], snaps[rid]
            if k > planned.get(rid, 0) or k > r.max_tokens - s.num_output - 1:
                fail("speculation", f"request {rid}: {k} drafts verified, the plan gave {planned.get(rid, 0)}, "
                     f"and it may emit {r.max_tokens - s.num_output} more tokens")
            gained = len(r.output_ids) - s.num_output
            if not 1 <= gained <= k + 1 or len(r.output_ids) > engine.target_len[rid]:
                fail("speculation", f"request {rid} gained {gained} tokens from {k} drafts "
                     f"({len(r.output_ids)} of its {engine.target_len[rid]} output tokens)")
            if r.block_table and len(r.block_table) != blocks_for(r.num_computed_tokens, engine.kv.block_size):
                fail("speculation", f"request {rid} holds {len(r.block_table)} KV blocks for "
                     f"{r.num_computed_tokens} computed tokens: a rejected draft's KV was not released")
            self.shared_times[rid] = self.shared_times.get(rid, 0) + gained - 1
            done[row] = (k, gained)
        return done
