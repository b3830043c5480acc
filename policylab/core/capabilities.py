"""What a data plane can do beyond executing a batch, declared in its type (`DataPlane.capabilities`).

The engine and its extensions ask these, never `hasattr`: a feature that needs a capability the
run's plane lacks is refused before the run (`policylab.core.features`), naming both.
"""
from __future__ import annotations

from enum import Enum


class Capability(str, Enum):
    TOKEN_IDS = "token_ids"            # reads Batch.token_ids (the sim computes nothing: it needs none)
    KV_BYTES = "kv_bytes"              # kv_block_bytes(block_size): prices KV moved over a link
    KV_CONTENTS = "kv_contents"        # export_kv / import_kv / copy_kv_blocks: the plane holds real K/V
    LOGPROBS = "logprobs"              # sampled_logprobs(rows, tokens): beam search's real scores
    DRAFTS = "drafts"                  # verifies draft tokens (Batch.spec_lens, StepResult.accepted)
    POSITIONAL_TOKENS = "positional_tokens"   # token_at(position), tokens(start, stop): the id sampled
                                       # after a position depends on the position only (the sim), so
                                       # decodes need no list and a decode batch may defer its tokens
    SCHEDULES_AHEAD = "schedules_ahead"   # the engine it models plans a step while the last one runs
                                       # (vLLM's async scheduling): arrivals are seen a step later
