"""Speculative decoding, data-plane side: verifying draft tokens, and pricing them.

A verification entry of a batch (`Batch.spec_lens[i] = k > 0`) computes k + 1 tokens: the
request's last token and k drafts. The plane answers with the drafts it accepts
(`StepResult.accepted[i]`) and the token sampled after the last accepted one (`sampled`).

- On the sim (`SimSpeculation`) acceptance is a model: draft j (1-based) is accepted when
  drafts 1..j-1 were and an independent draw with probability alpha succeeds (geometric: P(at
  least j accepted) = alpha^j). alpha is the trace's `spec_acceptance` for the request, else
  `speculative.acceptance_rate`. The draws hash (seed, request, position): a request sees the
  same acceptance at the same position whatever else is batched, whatever its k (common
  random numbers across policies and k). The emitted ids are the plane's ids by position, so a
  speculating replay produces the same tokens as a plain one. The target's step is priced by
  the cost model with its k + 1 query tokens; `method=draft` adds k sequential decode steps of
  the draft model's shape over the speculating requests; `method=ngram` costs nothing on the
  device (a host-side lookup).
- On the torch plane (`verify_greedy`) acceptance is real: the drafts (prompt lookup, proposed
  by the engine) are compared with the target's greedy choice at each position, so the output
  equals plain greedy decoding token for token.
"""
from __future__ import annotations

import numpy as np

from policylab.core.batch import Batch, StepResult
from policylab.core.rng import hash_key, splitmix64
from policylab.core.extensions.speculation import SpeculativeConfig, check_speculative_config

_UNIT = float(2 ** 64)


def geometric_accepted(seed: int, req_id: int, position: int, k: int, alpha: float) -> int:
    """Drafts accepted of k proposed after `position`: leading successes of k draws (each alpha)."""
    if k <= 0 or alpha <= 0.0:
        return 0
    u = splitmix64(hash_key("spec", seed, req_id), position, k).astype(np.float64) / _UNIT
    misses = np.flatnonzero(u >= alpha)
    return int(misses[0]) if misses.size else k


class SimSpeculation:
    """The sim plane's verification of speculative entries and the price of their drafts."""

    def __init__(self, cfg: SpeculativeConfig, seed: int = 0, draft_cost_model=None):
        check_speculative_config(cfg)
        if cfg.method == "draft" and draft_cost_model is None:
            raise ValueError("speculative.method=draft: the sim needs the draft model's shape "
                             "(speculative.draft_model) to price its steps")
        self.cfg, self.seed, self.draft = cfg, seed, draft_cost_model if cfg.method == "draft" else None

    def execute(self, plane, batch: Batch) -> StepResult:
        ids, accepted = [], {}
        alphas = batch.spec_alpha or [None] * len(batch)
        for i, (rid, c, n, s, k) in enumerate(zip(batch.req_ids, batch.context_lens, batch.query_lens,
                                                   batch.sample, batch.spec_lens)):
            if not s:
                continue
            if not k:
                ids.append(plane.token_at(c + n - 1))
                continue
            alpha = self.cfg.acceptance_rate if alphas[i] is None else alphas[i]
            a = geometric_accepted(self.seed, rid, c, k, alpha)
            accepted[i] = [plane.token_at(c + j) for j in range(a)]
            ids.append(plane.token_at(c + a))
        duration = plane._step_time(batch, sum(batch.query_lens), len(ids)) + self.draft_time(batch)
        return StepResult(ids, duration, accepted)

    def draft_time(self, batch: Batch) -> float:
        """k sequential decode steps of the draft model over the requests that speculate (0: n-gram)."""
        if self.draft is None:
            return 0.0
        rows = [(c, k) for c, k in zip(batch.context_lens, batch.spec_lens) if k]
        total = 0.0
        for j in range(max((k for _, k in rows), default=0)):
            ctx = [c + j for c, k in rows if k > j]
            total += self.draft.step_time([1] * len(ctx), ctx, len(ctx), len(ctx))
        return total

    def describe(self) -> dict:
        return {"method": self.cfg.method, "draft_model": self.cfg.draft_model,
                "acceptance_rate": self.cfg.acceptance_rate}


def verify_greedy(plane, batch: Batch) -> tuple:
    """The torch plane's verification: one forward over every token; a draft is accepted while it
    equals the target's argmax at its position; the token after the accepted ones is the argmax
    there. Entries without drafts sample as usual. (the StepResult, the logits of the rows each
    sampled token came from, in the order of `sampled`: the plane's log-probabilities of this step)"""
    import torch
    from policylab.dataplane.sampling import sample
    start = plane.clock()
    logits = plane.forward(batch, all_logits=True)
    rows = np.cumsum([0, *batch.query_lens])
    plain = [i for i, (s, k) in enumerate(zip(batch.sample, batch.spec_lens)) if s and not k]
    plain_tokens = iter(sample(logits[torch.as_tensor(rows[1:][plain] - 1, dtype=torch.long)],
                               [batch.sampling[i] for i in plain], [batch.req_ids[i] for i in plain],
                               [batch.context_lens[i] + batch.query_lens[i] for i in plain], plane.seed))
    ids, accepted, sampled_rows = [], {}, []
    for i, (s, k) in enumerate(zip(batch.sample, batch.spec_lens)):
        if not s:
            continue
        if not k:
            ids.append(next(plain_tokens))
            sampled_rows.append(int(rows[i + 1]) - 1)
            continue
        if batch.sampling[i].temperature != 0:
            raise ValueError(f"request {batch.req_ids[i]}: speculative decoding on the torch plane verifies "
                             "greedily; it needs temperature 0 (got "
                             f"{batch.sampling[i].temperature})")
        greedy = logits[rows[i]:rows[i] + k + 1].argmax(-1).tolist()
        drafts = [int(t) for t in batch.token_ids[i][1:]]
        a = 0
        while a < k and drafts[a] == greedy[a]:
            a += 1
        accepted[i] = drafts[:a]
        ids.append(greedy[a])
        sampled_rows.append(int(rows[i]) + a)
    if plane.device.type == "cuda":
        torch.cuda.synchronize(plane.device)
    duration = plane.clock() - start
    return StepResult(ids, duration, accepted), logits[torch.as_tensor(sampled_rows, dtype=torch.long,
                                                                       device=logits.device)]
