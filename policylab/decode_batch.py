"""The persistent decode batch: a replay's steady state, kept from one step to the next.

Most steps of a replay decode the same running requests as the step before (vLLM v1
keeps its `InputBatch` on the runner for the same reason). While that ordered set stays
the same, the per-request lists handed to the data plane are reused and a step's
bookkeeping (one token, one timestamp, one computed token per request) is one tight pass
with no per-request checks. Finishes and full blocks are known
ahead: each step adds exactly one token to every member, so the step on which a member
reaches its output length, and the steps on which its last block fills, follow from its
counts when the batch forms.
"""
from __future__ import annotations

from operator import sub

from policylab.dataplane.base import Batch


class DecodeBatch:
    """The running decodes of a plan (batch order), valid while every step decodes exactly them."""

    def __init__(self, plan_tokens, requests: list, target_len: dict, block_size: int):
        ids = list(plan_tokens)
        rs = [requests[i] for i in ids]
        self.ids, self.requests, self.block_size = ids, rs, block_size
        self.plan_tokens = plan_tokens     # the plan's mapping: the same one again, the same batch
        self._outputs = [r.output_ids for r in rs]
        self._times = [r.token_times for r in rs]
        self._targets = list(map(target_len.__getitem__, ids))
        self._context = [r.num_computed_tokens for r in rs]      # this step's context lengths
        self._steps = 0                           # steps decoded since the batch formed
        self._first_finish = min(map(sub, self._targets, map(len, self._outputs)))
        n = len(ids)
        self._query_lens, self._sample = [1] * n, [True] * n
        self._tables = [r.block_table for r in rs]
        self._sampling = [r.sampling for r in rs]
        self._by_phase: dict = {}                 # computed % block_size -> member ids
        for rid, c in zip(ids, self._context):
            self._by_phase.setdefault(c % block_size, []).append(rid)

    def batch(self) -> Batch:
        return Batch(self.ids, self._query_lens, self._context, self._tables, [], self._sample, self._sampling)

    def advance(self, sampled: list, now: float, eos) -> list:
        """Apply one step's tokens; returns the members that finished (the batch ends with them)."""
        self._steps += 1
        self._context = context = []          # a fresh list: batches stay as sent
        add = context.append
        for r, out, times, token in zip(self.requests, self._outputs, self._times, sampled):
            out.append(token)
            times.append(now)
            r.num_computed_tokens = c = r.num_computed_tokens + 1
            add(c)
        if self._steps < self._first_finish and (eos is None or eos not in sampled):
            return []
        return [r for r, out, target in zip(self.requests, self._outputs, self._targets)
                if len(out) >= target or out[-1] == eos]

    def full_last_block(self) -> list:
        """Members whose last KV block is full now: their next token takes a new block."""
        return self._by_phase.get(-self._steps % self.block_size, ())
