"""Wire objects between the engine and a data plane (vLLM v1's ModelRunner interface, trimmed).

The engine hands a `Batch` (flat, one entry per scheduled request, never padded) to
`DataPlane.execute`, which returns a `StepResult`: one sampled token for every entry
whose `sample` flag is set, and the step's duration, which drives the replay clock.
A batch is read-only to the data plane: in the decode steady state the engine hands the same
per-request lists (ids, tables, sampling) to consecutive steps, and never changes a batch
after its step, so a data plane may keep batches it was sent.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol


@dataclass
class Batch:
    req_ids: list = field(default_factory=list)
    query_lens: list = field(default_factory=list)     # tokens computed this step, per request
    context_lens: list = field(default_factory=list)   # tokens already in the KV cache before the step
    block_tables: list = field(default_factory=list)   # physical block ids, covering context + query
    token_ids: list = field(default_factory=list)      # np.int32 array of length query_len, per request
    sample: list = field(default_factory=list)         # True where the step completes the known tokens
    sampling: list = field(default_factory=list)       # SamplingParams per request
    spec_lens: list | None = None     # speculative steps: draft tokens per entry (its last query_lens)
    spec_alpha: list | None = None    # ... and the trace's acceptance rate per entry (None: the plane's)
    decodes: int = 0                  # its first entries that are one-token decodes, every one sampled

    def __len__(self) -> int:
        return len(self.req_ids)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)


def joined(a: Batch, b: Batch) -> Batch:
    """`a`'s entries, then `b`'s; `a`'s leading decodes lead. `b` is a batch just made, not yet sent:
    its lists take `a`'s entries in front, in place (no third batch made), and it is returned;
    `a`'s lists stay as they are."""
    b.req_ids[:0] = a.req_ids
    b.query_lens[:0] = a.query_lens
    b.context_lens[:0] = a.context_lens
    b.block_tables[:0] = a.block_tables
    b.token_ids[:0] = a.token_ids
    b.sample[:0] = a.sample
    b.sampling[:0] = a.sampling
    b.decodes = a.decodes
    return b


class StepResult(NamedTuple):
    """What a step returned. A named tuple: a plane that returns one every step makes it at C level
    with `StepResult.of((sampled, duration, accepted))`, no Python frame on the way."""
    sampled: list      # token ids, one per entry with sample=True, in batch order
    duration: float    # seconds this step took (measured, or modelled in simulation)
    accepted: dict | None = None   # speculative steps: batch row -> accepted draft ids (sampled follows them)


StepResult.of = classmethod(tuple.__new__)


class CommittedStep(NamedTuple):
    """What one commit did, for the postprocess of the same step (vLLM's `SchedulerOutput`)."""
    batch: Batch
    decodes: int             # the batch's first entries: running decodes, on the persistent decode batch
    requests: list           # the Requests of the other entries, in batch order
    preempted: int
    rejected: int


class DataPlane(Protocol):
    kind: str                 # its name in messages and in `dataplane=` (sim, torch, ...)
    vocab_size: int
    eos_token_id: int | None
    capabilities: frozenset   # policylab.core.capabilities.Capability: what it can do beyond `execute`

    def execute(self, batch: Batch) -> StepResult: ...

    def num_kv_blocks(self, block_size: int) -> int:
        """KV blocks this data plane can hold (from config, device memory or hardware spec)."""
        ...

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        """Called once by the engine with the block count it will manage, before the first step."""
        ...

    # What each capability adds (policylab.core.capabilities):
    #   KV_BYTES           kv_block_bytes(block_size) -> bytes one block holds on one device's link
    #   KV_CONTENTS        export_kv(table) -> payload, import_kv(table, payload, first=0),
    #                      copy_kv_blocks(src, dst): the K/V the KV manager moves
    #   LOGPROBS           sampled_logprobs(rows, tokens) -> log-probabilities of the last step's tokens
    #   DRAFTS             executes batches with `spec_lens`, returning `StepResult.accepted`
    #   POSITIONAL_TOKENS  token_at(position) -> the id sampled after that position; tokens(start, stop)
    #                      -> those after positions start..stop-1 (a decode batch defers its tokens)
    #   TOKEN_IDS          reads `Batch.token_ids` (without it the engine builds none)


def bad_duration(dataplane, batch: Batch, duration) -> ValueError:
    """The error for a step duration that is not a finite number >= 0 (DESIGN §5: it drives the clock)."""
    return ValueError(f"data plane {type(dataplane).__name__} returned a step duration of {duration!r} s for a "
                      f"batch of {len(batch)} requests ({batch.num_tokens} tokens, "
                      f"{sum(batch.context_lens)} context tokens): durations must be finite and >= 0")
