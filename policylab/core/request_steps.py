"""The plan's entries that go one request at a time (prefill chunks, requests starting or
resuming, any step that preempts or rejects): their commit before the step and their
postprocess after it. The steady decodes take the persistent decode batch instead
(`policylab.core.decoding`); both are steps of the one engine (`Engine._commit`, `Engine._postprocess`).
"""
from __future__ import annotations

from operator import attrgetter

from policylab.core.batch import Batch
from policylab.core.request import RUNNING, WAITING

_table, _sampling = attrgetter("block_table"), attrgetter("sampling")


class RequestSteps:
    """The engine's steps of the entries that go one request at a time (a base of `Engine`)."""

    def _commit_requests(self, sched: dict, preempt: list, reject: dict, swap: list = ()) -> tuple:
        """Rejections, then preemptions, then each scheduled request's KV (cache hits first):
        (the batch of `sched`'s entries, their Requests)."""
        now, kv, reqs, bs = self.clock.now, self.kv, self.requests, self.kv.block_size
        if preempt or self._decoding.in_batch(sched):    # the decode batch's members change
            self._decoding.forget_batch()
        rs = [reqs[rid] for rid in sched]
        waiting = self._waiting
        starting_ids = [r.req_id for r in rs if r.status is WAITING]
        starting = [reqs[rid] for rid in waiting.in_queue_order(starting_ids)]
        hits = [kv.hits(r) for r in starting]      # as validated: before a release changes the cache
        same_step = kv.same_step_hits(list(zip(rs, sched.values()))) if starting and kv.publishes_on_schedule else {}
        kv_hits = {r.req_id: h for r, h in zip(starting, hits) if r.swapped_blocks} if kv.host_used else {}
        for rid, reason in reject.items():
            self._reject(reqs[rid], f"rejected by policy: {reason}")
        preempted = [reqs[rid] for rid in preempt]
        swapping = set(swap)
        for r in preempted:
            computed = self.ops.evict(r, r.req_id in swapping)
            if r.req_id not in swapping:
                kv.stats["recomputed_tokens"] += computed
            r.status = WAITING
            r.num_preemptions += 1
        if starting:
            self._start(starting, hits)
        ns = list(sched.values())
        publish = kv.publishes_on_schedule     # each entry publishes its blocks before the next looks
        for r, n in zip(rs, ns):
            if same_step and r.req_id in same_step:     # blocks entries before it published this step
                taken = kv.take_published(r, same_step[r.req_id])
                r.num_computed_tokens += taken
                r.num_cached_tokens_total += taken
            c = r.num_computed_tokens
            if c + n > len(r.block_table) * bs:
                kv.grow(r.block_table, c + n)
            if r.swapped_blocks:
                kv.swap_in(r, len(kv_hits[r.req_id]))
            if publish:
                kv.publish_scheduled(r, c + n)
        batch = self._entries_batch(sched, rs, ns, [r.num_computed_tokens for r in rs])
        if preempted:
            self.running = [r for r in self.running if r.status is RUNNING] + starting
        elif starting:                  # (rejected requests were waiting: running only grows)
            self._run_also(starting)
        if preempted or reject or starting:
            waiting.remove(starting_ids)
            waiting.remove(reject)
            waiting.put_back([r.req_id for r in preempted])
        self._liveness.check(bool(reject))
        return batch, rs

    def _commit_entries(self, sched: dict):
        """The batch of the entries after the leading decodes when nothing is preempted or rejected
        (mostly a running prefill's chunk and a waiting request's first): `_commit_requests`' moves
        for running requests and at most one starting, without its passes for rejections,
        preemptions and several starts; None (nothing done) when one resumes (swapped out), more
        than one starts, one is neither running nor waiting, or a start could take blocks another
        entry publishes this step (publish-on-schedule)."""
        reqs, kv = self.requests, self.kv
        rs = list(map(reqs.__getitem__, sched))
        started = None
        for r in rs:
            status = r.status
            if r.swapped_blocks:
                return None
            if status is WAITING:
                if started is not None:
                    return None
                started = r
            elif status is not RUNNING:
                return None
        if started is not None and len(rs) > 1 and kv.publishes_on_schedule:
            return None
        if self._decoding.in_batch(sched):           # (as `_commit_requests`: the decode batch changes)
            self._decoding.forget_batch()
        bs = kv.block_size
        if started is not None:                      # its hits, taken before any allocation can evict one
            started = [started]
            self._start(started, [kv.hits(started[0])])
        ns = list(sched.values())
        ctxs, publish = [], kv.publishes_on_schedule
        for r, n in zip(rs, ns):
            c = r.num_computed_tokens
            if c + n > len(r.block_table) * bs:
                kv.grow(r.block_table, c + n)
            if publish:
                kv.publish_scheduled(r, c + n)
            ctxs.append(c)
        batch = self._entries_batch(sched, rs, ns, ctxs)
        if started:
            self._run_also(started)
            self._waiting.remove((started[0].req_id,))
        self._liveness.check(False)
        return batch, rs

    def _start(self, starting: list, hits: list) -> None:
        """Waiting requests start running with their cache hits (taken before any allocation can evict
        one; a swapped request's hits are computed tokens it has), then the start hooks run."""
        now, kv, bs = self.clock.now, self.kv, self.kv.block_size
        for r, blocks in zip(starting, hits):
            r.status = RUNNING
            if r.first_scheduled_time is None:
                r.first_scheduled_time = now
            if blocks:
                kv.start(r, blocks)
                if not r.swapped_blocks:
                    r.num_computed_tokens = len(blocks) * bs
                    r.num_cached_tokens_total += r.num_computed_tokens
        kv.promote_pending()                     # lower-tier hits come back to the device
        for hook in self._on_start:
            hook(starting)

    def _entries_batch(self, sched: dict, rs: list, ns: list, ctxs: list) -> Batch:
        """The batch of entries committed request by request (their context: computed before the step),
        in new lists (`batch.joined` puts the step's decodes in front of them)."""
        batch = Batch(list(sched), ns, ctxs, list(map(_table, rs)), [],
                      [c + n == r.prompt_len + len(r.output_ids) for r, n, c in zip(rs, ns, ctxs)],
                      list(map(_sampling, rs)))
        if self._token_ids:
            batch.token_ids = [r.token_ids(c, c + n) for r, n, c in zip(rs, ns, ctxs)]
        return batch

    def _postprocess_requests(self, requests: list, query_lens: list, sample: list, sampled: list) -> tuple:
        """The entries committed request by request: (finished requests, prefill tokens, prefill requests)."""
        now, kv, bs, eos = self.clock.now, self.kv, self.kv.block_size, self._eos
        finished, prefill_tokens, n_prefill = [], 0, 0
        target, decoding = self.target_len, self._decoding
        sampled = iter(sampled)
        for r, n, sample in zip(requests, query_lens, sample):
            out, rid = r.output_ids, r.req_id
            if n > 1 or not out:
                prefill_tokens += n
                n_prefill += 1
            before = r.num_computed_tokens
            r.num_computed_tokens = after = before + n
            if after // bs > before // bs and before < len(r.block_hashes) * bs:
                kv.register(r.block_table, r.block_hashes, after, before // bs)   # prompt blocks filled
            if sample:
                tok = next(sampled)
                out.append(tok)
                r.token_times.append(now)
                if len(out) >= target[rid] or tok == eos:
                    finished.append(r)
                    continue
            elif not out:               # (no token yet: it neither decodes nor did)
                continue
            decoding.update(r)          # it begins or stops decoding, or stays
        return finished, prefill_tokens, n_prefill
