"""Parallel samples as copy-on-write forks of one prompt's KV (DESIGN §4's paging, shared).

A trace request may ask for `n` samples of its prompt (`TraceRequest.n`, or
`engine.parallel_samples` for every request). The prompt is prefilled once, by the request
itself (sample 0). When it samples its first token, the other n - 1 samples are forked from
it: each is a request of its own (`Request.fork_of`), running, holding a reference on every
block of the prompt but its last token, which each fork computes again so that it samples its
own first token (on the torch plane from its own seeded draw). Forks decode as ordinary
running sequences: each takes its own slot of `max_num_seqs` and its token of the budget.

Shared blocks are counted once, and no block is written while it is shared: the KV manager
copies it for its writer first (copy-on-write, `policylab.core.kv.cow`).

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

from policylab.core.extension import Extension
from policylab.core.extensions.beams import BeamSearch, beam_width_of
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


class Forks(Extension):
    """Parallel samples and beams: forks spawned once a prompt has its first token, and a request
    reported done only with its last sample (the copies of shared blocks are the KV manager's)."""

    name = "forks"
    shares_kv = True

    def __init__(self, parallel_samples: int = 0, beam_width: int = 0):
        self.parallel_samples, self.beam_width = parallel_samples, beam_width
        self.stats = {"forked_requests": 0, "fork_sequences": 0, "queued_forks": 0, "cow_copies": 0,
                      "beam_requests": 0, "beam_replacements": 0}
        self._left: dict = {}         # req_id of a request with forks -> its samples not yet done

    def bind(self, ops) -> None:
        super().bind(ops)
        self.beams = BeamSearch(ops, ops.seed, self.stats)

    def section(self) -> dict:
        return self.stats

    # ------------------------------------------------------------------ spawn
    def on_tokens(self, requests: list, finished: list, now: float) -> list:
        """Fork every request committed this step that has just sampled its first token and asks for
        more samples: the forks that fit run now (they join the running requests, in order), the
        others wait at the front of the queue, as the policy sees them arrive."""
        if not requests:
            return finished
        running, out = [], []
        ops = self.ops
        room = ops.cfg.max_num_seqs - ops.num_running
        for r in requests:
            if r.fork_of is not None or r.forks is not None or len(r.output_ids) != 1:
                continue
            beam, lengths = fork_plan(ops.trace_request(r.req_id), self.parallel_samples, self.beam_width)
            if not lengths or beam and ops.target(r.req_id) <= 1:   # (one token: one beam, done)
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
        if out:
            ops.requeue([c.req_id for c in out])
        if running:
            ops.join_running(running)
        return finished

    def _fork(self, parent: Request, output_tokens: int, now: float, share: bool, beam: bool) -> Request:
        ops = self.ops
        kv = ops.kv
        child = Request(ops.num_requests, parent.arrival_time, parent.prompt_ids, parent.max_tokens, parent.client,
                        parent.priority, parent.ttft_slo, parent.tpot_slo, parent.predicted_output_tokens,
                        parent.sampling, fork_of=parent.req_id)
        child.own_prompt, child.block_hashes = parent.own_prompt, array("Q", parent.block_hashes)
        if beam:                      # every block and the first token: a beam decodes at once
            child.status, child.first_scheduled_time = Status.RUNNING, parent.first_scheduled_time
            child.num_computed_tokens = parent.num_computed_tokens
            child.output_ids, child.token_times = list(parent.output_ids), list(parent.token_times)
            child.block_table = kv.fork(parent.block_table, len(parent.block_table))
        elif share:                   # every prompt block but its last token's write: shared
            child.status, child.first_scheduled_time = Status.RUNNING, now
            child.num_computed_tokens = len(parent.prompt_ids) - 1
            child.block_table = kv.fork(parent.block_table, blocks_for(child.num_computed_tokens, kv.block_size))
        else:
            self.stats["queued_forks"] += 1
        ops.add_request(child, min(output_tokens, parent.max_tokens))
        self.stats["fork_sequences"] += 1
        return child

    # ------------------------------------------------------------------ completion
    def after_step(self, sampled_ids: list, sampled: list) -> None:
        """Beam search's scores and rounds, once a step's tokens are in (nothing without beams)."""
        self.stats["cow_copies"] = self.ops.kv.copies_made
        if self.beams.score:
            self.beams.after_step(sampled_ids, sampled)

    def on_done(self, r: Request):
        """The trace request to report now that `r` is done (finished or rejected): `r` itself
        without forks, its parent once every sample is done, else None (samples still run)."""
        parent = self.ops.request(r.trace_id)
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

    def on_stopped(self) -> None:
        """The run stopped early: requests with samples still to go are unfinished."""
        settle_stopped(self.ops.request(i) for i in range(self.ops.num_requests))


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


def forks_summary(stats, requests: list, forks: list, makespan: float) -> dict:
    """The `forks` section of summary.json: the counters, the output tokens of the samples beyond
    each trace request's first (`forks`) and of all samples (`requests`' too) per second."""
    own = sum(len(r.output_ids) for r in requests if r is not None)
    tokens = sum(len(c.output_ids) for c in forks)
    return {**stats, "fork_output_tokens": tokens,
            "finished_forks": sum(1 for c in forks if c.status is Status.FINISHED),
            "fork_preemptions": sum(c.num_preemptions for c in forks),
            "all_samples_output_tokens_per_s": (own + tokens) / makespan if makespan > 0 else None}
