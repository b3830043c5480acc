"""Next-token sampling: greedy in one batched argmax, stochastic per request.

A stochastic draw uses its own torch.Generator seeded from (run seed, request's sampling
seed, req_id, position of the sampled token), so a token does not depend on what else
was batched with it, or on preemptions and recomputation: replays are reproducible.
"""
from __future__ import annotations

import torch

from policylab.core.rng import hash_key
from policylab.core.request import SamplingParams


def draw_seed(seed: int, params: SamplingParams, req_id: int, position: int) -> int:
    return hash_key("sample", seed, params.seed, req_id, position)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) tokens outside the top-k and outside the smallest top-p nucleus; logits [V]."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        outside = probs.cumsum(-1) - probs >= top_p        # mass before this token already covers top_p
        logits = logits.masked_fill(torch.zeros_like(outside).scatter(0, order, outside), float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: list, req_ids: list, positions: list, seed: int) -> list:
    """One token id (python int) per row of logits [S, V]; rows in the order of params."""
    if not len(params):
        return []
    tokens = logits.argmax(-1).tolist()
    for i, p in enumerate(params):
        if p.temperature < 0 or not 0.0 < p.top_p <= 1.0 or p.top_k < 0:
            raise ValueError(f"request {req_ids[i]}: bad sampling params {p} (temperature >= 0, "
                             "0 < top_p <= 1, top_k >= 0)")
        if p.temperature == 0:
            continue
        row = filter_logits(logits[i].float() / p.temperature, p.top_k, p.top_p)
        gen = torch.Generator(device=logits.device).manual_seed(draw_seed(seed, p, req_ids[i], positions[i]))
        tokens[i] = int(torch.multinomial(row.softmax(-1), 1, generator=gen))
    return tokens
