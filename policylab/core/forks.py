"""Parallel samples as copy-on-write forks of one prompt's KV (DESIGN §4's paging, shared).

A trace request may ask for `n` samples of its prompt (`TraceRequest.n`, or
`engine.parallel_samples` for every request). The prompt is prefilled once, by the request
itself (sample 0). When it samples its first token, the other n - 1 samples are forked from
it: each is a request of its own (`Request.fork_of`), running, holding a reference on every
block of the prompt but its last token, which each fork computes again so that it samples its
own first token (on the torch plane from its own seeded draw). Forks decode as ordinary
running sequences: each takes its own slot of `max_num_seqs` and its token of the budget.

Shared blocks are counted once (the block manager counts a block with any reference as one
used block), and no block is written while it is shared: a step that writes into a block
with more than one reference first gives the writer a copy of it (copy-on-write, vLLM v0's
`BlockSpaceManager.fork` and `append_slots`). The last holder writes in place, so of W
writers of a block held R times, min(W, R - 1) copy: the validator charges exactly that and
`blocks_needed` one block for each writer of a shared block.

A fork whose slot is not free when the prompt is done (the running requests already fill
`max_num_seqs`) waits instead as a plain request at the front of the queue: the policy
admits it like any other, its prompt then mostly prefix-cache hits.

A request with forks is done when all its samples are: its `finish_time` is the last
sample's, its row in the results is sample 0's stream (TTFT, TPOT, ITL), and the
`forks` section of the summary counts every sample's tokens. In a run that stops first, a
request with samples still to go is unfinished (`settle_stopped`), its reason the samples done.
"""
from __future__ import annotations

from array import array
from collections import Counter

from policylab.core.beams import BeamSearch, beam_width_of
from policylab.core.contract import RequestView
from policylab.core.kv import blocks_for
from policylab.core.request import Request, Status


def samples_of(t, parallel_samples: int) -> int:
    """Samples of trace request `t`: `engine.parallel_samples` when set (>= 1), else its own `n`."""
    return parallel_samples if parallel_samples else t.n


def fork_lengths(t, samples: int) -> list:
    """Output tokens of samples 1..samples-1: the trace's `fork_output_tokens` when it lists them
    (cycled when an override asks for more), else `output_tokens` each."""
    own = t.fork_output_tokens
    return [own[i % len(own)] if own else t.output_tokens for i in range(samples - 1)]


def fork_plan(t, parallel_samples: int, beam_width: int) -> tuple:
    """(beam search?, output tokens of each fork) of trace request `t`: w - 1 beams of its own
    length, or n - 1 samples of theirs (beams win when both are asked for by overrides)."""
    width = beam_width_of(t, beam_width)
    if width > 1:
        return True, [t.output_tokens] * (width - 1)
    return False, fork_lengths(t, samples_of(t, parallel_samples))


def uses_forks(trace, parallel_samples: int, beam_width: int = 0) -> bool:
    return parallel_samples > 1 or beam_width > 1 or any(t.n > 1 or t.beam_width > 1 for t in trace)


def vllm_refusal(trace, parallel_samples: int, beam_width: int = 0) -> str:
    """The one line `dataplane=vllm` refuses forks with ('' when the run asks for none)."""
    if not uses_forks(trace, parallel_samples, beam_width):
        return ""
    return ("dataplane=vllm does not run parallel samples or beam search (a trace's `n` or `beam_width` > 1, "
            "or engine.parallel_samples / engine.beam_width > 1): replay them on dataplane=sim or "
            "dataplane=torch, or set engine.parallel_samples=1 engine.beam_width=1")


class SharedWrites:
    """The block manager's copy-on-write arithmetic: which blocks a write of tokens lands in that
    another request holds too, and how many copies a set of writes takes."""

    def __init__(self, ref: list, block_size: int):
        self._ref, self.block_size = ref, block_size

    def shared_blocks(self, r, n: int) -> list:
        """Indices in `r.block_table` of the existing blocks that computing `n` more tokens of `r`
        writes and that another table holds too."""
        table, bs, ref = r.block_table, self.block_size, self._ref
        start, stop = r.num_computed_tokens // bs, min(len(table), blocks_for(r.num_computed_tokens + n, bs))
        return [i for i in range(start, stop) if ref[table[i]] > 1]

    def blocks_for_write(self, r, n: int) -> int:
        """Copies giving running request `r` `n` more tokens takes if it writes before the other holders."""
        return len(self.shared_blocks(r, n))

    def copies(self, writes, preempted=()) -> int:
        """Blocks the copies of `writes` ((request, tokens) pairs of one step) take once the
        `preempted` requests have released their tables: min(writers, holders left - 1) per block."""
        writers = Counter()
        for r, n in writes:
            if r.block_table:
                table = r.block_table
                writers.update(table[i] for i in self.shared_blocks(r, n))
        if not writers:
            return 0
        released = Counter()
        for r in preempted:
            released.update(b for b in r.block_table if b in writers)
        ref = self._ref
        return sum(max(0, min(w, ref[b] - released[b] - 1)) for b, w in writers.items())


class Forks:
    """The engine's side of parallel samples: spawning forks, copying shared blocks before a
    step writes them, and telling when a request's last sample is done."""

    def __init__(self, engine, parallel_samples: int, beam_width: int = 0):
        self.engine, self.parallel_samples, self.beam_width = engine, parallel_samples, beam_width
        self.kv = engine.kv
        self.writes = self.kv.cow = SharedWrites(self.kv._ref, self.kv.block_size)   # (the live counts)
        self.copy_kv = getattr(engine.dataplane, "copy_kv_blocks", None)
        self.stats = {"forked_requests": 0, "fork_sequences": 0, "queued_forks": 0, "cow_copies": 0,
                      "beam_requests": 0, "beam_replacements": 0}
        self.beams = BeamSearch(engine, engine.seed, self.stats)
        self._left: dict = {}         # req_id of a request with forks -> its samples not yet done

    # ------------------------------------------------------------------ spawn
    def spawn(self, requests: list, now: float) -> list:
        """Fork every request of `requests` that has just sampled its first token and asks for more
        samples: the forks that run now (they join the running requests), in order."""
        running, out = [], []
        engine = self.engine
        room = engine.cfg.max_num_seqs - len(engine.running)
        for r in requests:
            if r.fork_of is not None or r.forks is not None or len(r.output_ids) != 1:
                continue
            beam, lengths = fork_plan(engine.trace[r.req_id], self.parallel_samples, self.beam_width)
            if not lengths or beam and engine.target_len[r.req_id] <= 1:   # (one token: one beam, done)
                continue
            r.forks = []
            self.stats["forked_requests"] += 1
            for length in lengths:
                share = room > 0
                child = self._fork(r, length, now, share, beam and share)
                r.forks.append(child)
                (running if share else out).append(child)
                room -= share
            if beam:
                self.beams.start(r, [c for c in r.forks if c.status is Status.RUNNING])
        if out:                       # at the front of the queue, as the policy sees them arrive
            ids = [c.req_id for c in out]
            engine._waiting.put_back(ids)
            engine._arrived.extend(ids)
        return running

    def _fork(self, parent: Request, output_tokens: int, now: float, share: bool, beam: bool) -> Request:
        engine, kv = self.engine, self.kv
        k = len(engine.requests)
        child = Request(k, parent.arrival_time, parent.prompt_ids, parent.max_tokens, parent.client,
                        parent.priority, parent.ttft_slo, parent.tpot_slo, parent.predicted_output_tokens,
                        parent.sampling, fork_of=parent.req_id)
        child.own_prompt, child.block_hashes = parent.own_prompt, array("Q", parent.block_hashes)
        if beam:                      # every block and the first token: a beam decodes at once
            child.status, child.first_scheduled_time = Status.RUNNING, parent.first_scheduled_time
            child.num_computed_tokens = parent.num_computed_tokens
            child.output_ids, child.token_times = list(parent.output_ids), list(parent.token_times)
            kv.acquire(child.block_table, parent.block_table)
            engine._decoding.update(child)
        elif share:                   # every prompt block but its last token's write: shared
            child.status, child.first_scheduled_time = Status.RUNNING, now
            child.num_computed_tokens = len(parent.prompt_ids) - 1
            kv.acquire(child.block_table, parent.block_table[:blocks_for(child.num_computed_tokens,
                                                                         kv.block_size)])
        else:
            self.stats["queued_forks"] += 1
        engine.requests.append(child)
        engine.target_len.append(min(output_tokens, parent.max_tokens))
        engine.views[k] = RequestView(child, kv)
        self.stats["fork_sequences"] += 1
        return child

    # ------------------------------------------------------------------ copy-on-write
    def copy_on_write(self, sched: dict) -> None:
        """Give each scheduled request that writes into a shared block its own copy first (in plan
        order; the last holder keeps the block): no block is written while shared."""
        reqs, kv, writes = self.engine.requests, self.kv, self.writes
        src, dst = [], []
        for rid, n in sched.items():
            r = reqs[rid]
            if not r.block_table:
                continue
            for i in writes.shared_blocks(r, n):
                old = r.block_table[i]
                r.block_table[i] = new = kv.copy_block(old)
                src.append(old)
                dst.append(new)
        if src:
            self.stats["cow_copies"] += len(src)
            if self.copy_kv is not None:
                self.copy_kv(src, dst)

    # ------------------------------------------------------------------ completion
    def after_step(self, sampled_ids: list, sampled: list) -> None:
        """Beam search's scores and rounds, once a step's tokens are in (nothing without beams)."""
        if self.beams.score:
            self.beams.after_step(sampled_ids, sampled)

    def group_done(self, r: Request):
        """The trace request to report now that `r` is done (finished or rejected): `r` itself
        without forks, its parent once every sample is done, else None (samples still run)."""
        parent = self.engine.requests[r.trace_id]
        if parent.forks is None:
            return parent
        left = self._left.get(parent.req_id, len(parent.forks) + 1) - 1     # (counted: a scan of every
        if left:                                                            # sample per sample is n^2)
            self._left[parent.req_id] = left
            return None
        self._left.pop(parent.req_id, None)
        if parent.status is Status.FINISHED:
            parent.finish_time = max(m.finish_time for m in (parent, *parent.forks) if m.status is Status.FINISHED)
        return parent


def settle_stopped(requests) -> None:
    """A run that stopped early: a request whose samples are not all done is unfinished, however
    far its own stream got (its status back to running, no finish time), with the reason
    `K of N samples finished when the run stopped`. Requests without forks are left as they are."""
    done = (Status.FINISHED, Status.REJECTED)
    for r in requests:
        if r is None or not r.forks:
            continue
        finished = (r.status in done) + sum(1 for m in r.forks if m.status in done)
        if finished <= len(r.forks):
            if r.status in done:
                r.status, r.finish_time = Status.RUNNING, None
            r.reject_reason = f"{finished:,} of {len(r.forks) + 1:,} samples finished when the run stopped"


def forks_summary(stats: dict, requests: list, trace_len: int, makespan: float) -> dict:
    """The `forks` section of summary.json: the engine's counters, the output tokens of the samples
    beyond each request's first (`requests[trace_len:]`, the forks) and of all samples per second."""
    forks = [c for c in requests[trace_len:] if c is not None]
    own = sum(len(r.output_ids) for r in requests[:trace_len] if r is not None)
    tokens = sum(len(c.output_ids) for c in forks)
    return {**stats, "fork_output_tokens": tokens,
            "finished_forks": sum(1 for c in forks if c.status is Status.FINISHED),
            "fork_preemptions": sum(c.num_preemptions for c in forks),
            "all_samples_output_tokens_per_s": (own + tokens) / makespan if makespan > 0 else None}
