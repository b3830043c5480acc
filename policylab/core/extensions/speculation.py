"""Speculative decoding, engine side: the contract's rules for `StepPlan.spec_tokens`, and the
commit and postprocess of a step that verifies draft tokens.

A plan may give a decoding request k speculative tokens. The step then computes k + 1 tokens
for it (its last sampled token and k drafts) and the data plane verifies them: it returns the
drafts it accepted (`StepResult.accepted`) and one token sampled after them, so the request
gains 1..k+1 tokens in one step, all at the step's end time. The KV of the rejected drafts is
released at once (the blocks grown for them and not needed are freed), and the engine clamps
what a step emits to the request's hidden output length: policies cap k by `max_tokens`, the
only length they may know.

Drafts come from the data plane's method: on a plane that reads token ids (torch) the engine
proposes them here by n-gram lookup over the request's own tokens (prompt lookup); on the sim
no id is needed and the plane models acceptance (policylab.dataplane.speculative).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from policylab.core.capabilities import Capability
from policylab.core.extension import Extension
from policylab.core.kv import blocks_for
from policylab.core.spec_rules import check_spec_tokens  # noqa: F401  (the contract's rules of drafts)

METHODS = ("ngram", "draft")
VLLM_REFUSAL = ("speculative decoding (StepPlan.spec_tokens, speculative.k) runs on dataplane=sim and "
                "dataplane=torch only: dataplane=vllm does not verify draft tokens a policylab policy schedules")


@dataclass
class SpeculativeConfig:
    """`speculative.*`: how drafts are made and priced, and a fixed k for any policy."""
    k: int = 0                        # >0: every policy gives each decode up to k drafts (FixedSpeculation)
    method: str = "ngram"             # ngram (prompt lookup, ~free) | draft (a draft model, priced on the sim)
    draft_model: Optional[str] = None # method=draft: a configs/model/ name (the draft's shape)
    acceptance_rate: float = 0.7      # sim: per-draft acceptance alpha (a trace's spec_acceptance wins)
    ngram_max: int = 3                # n-gram lookup: longest suffix matched
    ngram_min: int = 1                # ... shortest


def check_speculative_config(cfg: SpeculativeConfig) -> None:
    if not isinstance(cfg.k, int) or cfg.k < 0:
        raise ValueError(f"speculative.k must be an int >= 0, got {cfg.k!r}")
    if cfg.method not in METHODS:
        raise ValueError(f"speculative.method must be one of {', '.join(METHODS)}, got '{cfg.method}'")
    if cfg.method == "draft" and not cfg.draft_model:
        raise ValueError("speculative.method=draft needs speculative.draft_model (a configs/model/ name)")
    if not 0.0 <= cfg.acceptance_rate <= 1.0:
        raise ValueError(f"speculative.acceptance_rate must be in [0, 1], got {cfg.acceptance_rate!r}")
    if not 1 <= cfg.ngram_min <= cfg.ngram_max:
        raise ValueError(f"speculative.ngram_min/ngram_max must satisfy 1 <= min <= max, got "
                         f"{cfg.ngram_min}, {cfg.ngram_max}")


# ------------------------------------------------------------------- drafts
def ngram_drafts(tokens: np.ndarray, k: int, n_min: int = 1, n_max: int = 3) -> np.ndarray:
    """Prompt lookup: the k tokens that followed an earlier occurrence of the sequence's last n
    tokens (longest n first): the latest occurrence followed by k known tokens, else the latest
    (fewer drafts); none where the sequence has no such match."""
    size = len(tokens)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        suffix = tokens[size - n:]
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:size - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1)) + n      # where each continuation starts
        if hits.size:
            full = hits[hits + k <= size]
            start = int(full[-1] if full.size else hits[-1])
            return tokens[start:start + k]
    return tokens[:0]


# ------------------------------------------------------------------- engine
class Speculation(Extension):
    """The engine's speculative steps (a plan's `spec_tokens`) and the run's counters (summary.json's
    `speculative`)."""

    name = "speculation"
    plan_field = "spec_tokens"

    def __init__(self, config: Optional[SpeculativeConfig] = None):
        self.config = config or SpeculativeConfig()
        self.stats = {"proposed_tokens": 0, "accepted_tokens": 0, "rejected_tokens": 0, "verifications": 0,
                      "emitted_tokens": 0, "released_blocks": 0}
        self.rows: list = []            # the committed step's rows grown for drafts
        self.last_step: list = []       # (req_id, proposed, accepted, emitted, blocks freed) of the last step

    def section(self) -> dict:
        return self.stats

    def claim(self, spec: dict) -> dict:
        """The entries of a valid `spec_tokens` with k > 0 (none: the plan is a plain one)."""
        return {rid: k for rid, k in spec.items() if k} if spec else spec

    @staticmethod
    def widen(chunks: dict, spec: dict) -> dict:
        """The scheduled tokens with each speculating decode's k drafts added (KV grown for all)."""
        return {rid: n + spec.get(rid, 0) for rid, n in chunks.items()}

    def mark(self, batch, requests: list, spec: dict) -> None:
        """Make the widened entries verification entries: sampled, their drafts in `token_ids`
        (proposed here on a plane that reads ids) and `spec_lens`, the trace's acceptance rates."""
        ops, cfg = self.ops, self.config
        reads_ids = Capability.TOKEN_IDS in ops.capabilities
        lens, alphas = [0] * len(requests), [None] * len(requests)
        self.rows = []                  # batch rows whose KV was grown for drafts
        for i, r in enumerate(requests):
            k = spec.get(r.req_id, 0)
            if not k:
                continue
            self.rows.append(i)
            if reads_ids:
                tokens = r.token_ids(0, r.num_tokens)
                drafts = ngram_drafts(np.asarray(tokens), k, cfg.ngram_min, cfg.ngram_max)
                batch.token_ids[i] = np.concatenate([np.asarray(tokens[-1:], np.int32), drafts.astype(np.int32)])
                k = len(drafts)
            batch.query_lens[i] = 1 + k
            batch.sample[i] = True
            lens[i], alphas[i] = k, ops.trace_request(r.trace_id).spec_acceptance
        batch.spec_lens, batch.spec_alpha = lens, alphas

    def verify(self, requests: list, batch, result, now: float) -> tuple:
        """Apply each verification: its accepted drafts (clamped to the hidden output length and to
        EOS) join the outputs at `now`, the rejected drafts' blocks are freed. Returns the query
        lengths and sampled tokens with which the rest of postprocess sees every entry as a plain
        one-token decode that sampled the step's last emitted token."""
        ops, stats = self.ops, self.stats
        kv, bs, eos = ops.kv, ops.kv.block_size, ops.eos
        accepted = result.accepted or {}
        query_lens, sampled = list(batch.query_lens), list(result.sampled)
        self.last_step = []
        rows, j = set(self.rows), 0
        for i, (r, s, k) in enumerate(zip(requests, batch.sample, batch.spec_lens)):
            if not s:
                continue
            if i in rows:
                emitted = [*accepted.get(i, ()), sampled[j]][:ops.target(r.req_id) - len(r.output_ids)]
                if eos is not None and eos in emitted:
                    emitted = emitted[:emitted.index(eos) + 1]
                extra = len(emitted) - 1
                r.output_ids.extend(emitted[:-1])
                r.token_times.extend([now] * extra)
                r.num_computed_tokens += extra
                sampled[j], query_lens[i] = emitted[-1], 1
                freed = kv.trim(r.block_table, blocks_for(batch.context_lens[i] + len(emitted), bs))
                stats["released_blocks"] += freed
                self.last_step.append((r.req_id, k, extra, len(emitted), freed))
                if k:
                    stats["proposed_tokens"] += k
                    stats["accepted_tokens"] += extra
                    stats["rejected_tokens"] += k - extra
                    stats["verifications"] += 1
                    stats["emitted_tokens"] += len(emitted)
            j += 1
        return query_lens, sampled


def spec_summary(stats: Optional[dict]) -> Optional[dict]:
    """summary.json's `speculative` section from a run's counters (None when no draft was verified)."""
    if not stats or not stats["verifications"]:
        return None
    return {**stats, "acceptance_rate": stats["accepted_tokens"] / stats["proposed_tokens"],
            "tokens_per_step": stats["emitted_tokens"] / stats["verifications"]}
