"""What a replay returns: every trace request's fate and the per-step records (DESIGN §6 inputs)."""
from __future__ import annotations

from dataclasses import dataclass

STEP_FIELDS = ("clock", "duration", "batch_size", "prefill_tokens", "decode_tokens",
               "num_prefill_reqs", "num_decode_reqs", "kv_used_blocks", "waiting", "running",
               "preempted", "rejected")


@dataclass
class RunResult:
    trace: list                      # TraceRequest, arrival order
    requests: list                   # Request per trace entry (None if it never arrived)
    steps: dict                      # column -> list, one row per executed step
    num_blocks: int
    block_size: int
    policy: str
    status: str = "complete"         # complete | partial
    error: str = ""
    traceback: str = ""              # of the exception that ended a partial run (none for Ctrl-C)

    @property
    def partial(self) -> bool:
        return self.status != "complete"
