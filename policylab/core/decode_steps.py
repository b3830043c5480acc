"""The engine's steady state on the persistent decode batch (DESIGN §2 commit/postprocess).

Split from `engine.py` by concept: under load nearly every step either only decodes the
running requests or decodes them beside a few prefill chunks (chunked prefill). These
paths keep the decodes on `DecodeBatch` (no per-request loop) and hand only the prefills
to the engine's general path. `Engine` inherits them; they read and change its state.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from policylab.core.batch import Batch
from policylab.core.contract import StepPlan


class DecodeSteps:
    """Mixed into `Engine`: commit and postprocess of decode-only and mixed steps."""

    def _commit_decodes(self, plan: StepPlan) -> Batch:
        """Commit a plan of running decodes only, the steady state: the persistent batch, no loop."""
        sched, db = plan.num_scheduled_tokens, self._decode_batch
        if not (sched is self._decode_all is db.plan_tokens):   # the view's read-only decode_all,
            db.become(list(sched))                              # unchanged, means the same requests
            db.plan_tokens = sched
        needs_block = self._needs_block
        growing = list(needs_block) if len(sched) == len(self._decoding) else needs_block.keys() & sched.keys()
        for rid in growing:
            self.kv.grow_one(self.requests[rid].block_table)
            del needs_block[rid]                     # its last block is no longer full
        batch = db.batch()
        if self.dataplane.needs_token_ids:
            batch.token_ids = [np.array(r.output_ids[-1:], np.int32) for r in db.requests]
        self._pending_counts = (0, 0)          # (a decode step always samples: no liveness check)
        return batch

    def _commit_mixed(self, plan: StepPlan, decodes: list, chunks: dict) -> Optional[Batch]:
        """Commit running decodes and prefill chunks together (chunked prefill's every step): the
        decodes on the persistent batch, only the prefills (`chunks`, the plan's other entries)
        one by one; decodes lead the batch."""
        prefills = self._commit(StepPlan(chunks))
        db = self._decode_batch
        db.become(decodes)
        db.plan_tokens = None
        needs_block = self._needs_block
        for rid in needs_block.keys() & set(decodes):
            self.kv.grow_one(self.requests[rid].block_table)
            del needs_block[rid]
        d = db.batch()
        self._mixed_decodes, self._prefill_batch = len(d.req_ids), prefills
        if prefills is None:
            batch = d
        else:
            batch = Batch(d.req_ids + prefills.req_ids, d.query_lens + prefills.query_lens,
                          d.context_lens + prefills.context_lens, d.block_tables + prefills.block_tables, [],
                          d.sample + prefills.sample, d.sampling + prefills.sampling)
        if self.dataplane.needs_token_ids:
            batch.token_ids = [np.array(r.output_ids[-1:], np.int32) for r in db.requests] + (
                prefills.token_ids if prefills is not None else [])
        return batch

    def _postprocess_decodes(self, sampled: list) -> list:
        """The steady state: the persistent batch takes the tokens; returns the finished requests."""
        db, needs_block = self._decode_batch, self._needs_block
        finished = db.advance(sampled, self.clock.now, self._eos)
        for rid in db.full_last_block():
            needs_block[rid] = None
        if finished:
            db.leave(finished)
        return finished
