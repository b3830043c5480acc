"""A simple beam search over copy-on-write forks: beams that fall behind become copies of the best.

A trace request with `beam_width` w > 1 (or `engine.beam_width` for every request) forks into w
beams once its prompt has its first token: each fork shares every block of the request, its
partial last block included, and the same first token (vLLM v0's beam fork). Every beam then
samples its own tokens and adds each token's log-probability to its score (the torch plane's real
log-probabilities; on the sim, which samples no distribution, a seeded draw of log(u), u uniform
in (0, 1]). Whenever every beam of a request is running and all have the same number of tokens
(a round), the w // 2 lowest-scoring beams are replaced by copies of the best one: a loser drops
its blocks, takes a reference on each of the best beam's, its tokens and its score. The blocks
they then share are copied when either writes into them (`policylab.core.extensions.forks`).

This is a stochastic beam (each beam samples one continuation and the worst are resampled from
the best), not the top-w expansion of every beam's candidates: it exercises forking running
sequences on the fly and copy-on-write at every round, which is the KV behaviour of beam search.
A round is skipped while some beam is preempted, recomputing its KV (running, but not decoding)
or not yet in step with the others.
Under speculative decoding a beam's step emits its accepted drafts and one sampled token: the
score adds that sampled token's log-probability (the drafts' are not asked for), and beams that
accept different numbers of drafts fall out of step until a round finds them level again.
"""
from __future__ import annotations

import math

from policylab.core.request import Request, Status, is_decoding
from policylab.core.rng import hash_key

_UNIT = 2.0 ** -53


def beam_width_of(t, override: int) -> int:
    """Beams of trace request `t`: `engine.beam_width` when set (>= 1), else its own `beam_width`."""
    return override if override else t.beam_width


class BeamSearch:
    """Scores of each beam, and the round at which each request's beams last compared."""

    def __init__(self, ops, seed: int, stats: dict):
        self.ops, self.seed, self.stats = ops, seed, stats
        self.score: dict = {}            # req_id of a beam -> its log-probability so far
        self.round: dict = {}            # req_id of a beam request -> tokens when last compared

    def start(self, parent: Request, forks: list) -> None:
        """The beams of `parent` begin from its first token, which they share (not scored)."""
        self.stats["beam_requests"] += 1
        self.round[parent.req_id] = len(parent.output_ids)
        for b in (parent, *forks):
            self.score[b.req_id] = 0.0

    def after_step(self, sampled_ids: list, sampled: list) -> None:
        """Score this step's tokens of beams, then compare the beams of each request in step."""
        score, request = self.score, self.ops.request
        rows = [i for i, rid in enumerate(sampled_ids) if rid in score and len(request(rid).output_ids) > 1]
        if not rows:
            return
        values = self.ops.logprobs(rows, [sampled[i] for i in rows])
        if values is None:           # (a plane that samples no distribution)
            values = [self._sim_logprob(sampled_ids[i], len(request(sampled_ids[i]).output_ids)) for i in rows]
        parents = {}
        for i, lp in zip(rows, values):
            rid = sampled_ids[i]
            score[rid] = score.get(rid, 0.0) + lp
            parents[request(rid).trace_id] = None
        for pid in parents:
            self._compare(request(pid))

    def _sim_logprob(self, rid: int, position: int) -> float:
        u = ((hash_key("beam", self.seed, rid, position) >> 11) + 1) * _UNIT
        return math.log(u)

    def _compare(self, parent: Request) -> None:
        beams = (parent, *(parent.forks or ()))
        length = len(parent.output_ids)
        if len(beams) < 2 or length <= self.round.get(parent.req_id, length) or any(
                b.status is not Status.RUNNING or len(b.output_ids) != length or not is_decoding(b) for b in beams):
            return          # (a beam recomputing its KV is running and in step, but its table holds
                            # fewer tokens than it claims: no copy of it, and none made of it, until it decodes)
        self.round[parent.req_id] = length
        if length >= self.ops.target(parent.req_id):
            return
        score = self.score
        ranked = sorted(beams, key=lambda b: (-score.get(b.req_id, 0.0), b.req_id))
        best = ranked[0]
        for loser in ranked[len(ranked) - len(ranked) // 2:]:
            self._replace(loser, best)

    def _replace(self, loser: Request, best: Request) -> None:
        """`loser` becomes a copy of `best` (same computed tokens): its tables and token lists are
        changed in place, so the engine's decode batch, which holds them, stays valid."""
        kv = self.ops.kv
        kv.adopt(loser.block_table, best.block_table)
        loser.output_ids[:] = best.output_ids
        del loser.block_hashes[len(loser.prompt_ids) // kv.block_size:]   # its output blocks: new content
        self.score[loser.req_id] = self.score.get(best.req_id, 0.0)
        self.stats["beam_replacements"] += 1
