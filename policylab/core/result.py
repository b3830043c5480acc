"""What a replay returns: every trace request's fate and the per-step records (DESIGN §6 inputs)."""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field

from policylab.core.contract import ContractViolation

STEP_FIELDS = ("clock", "duration", "batch_size", "prefill_tokens", "decode_tokens",
               "num_prefill_reqs", "num_decode_reqs", "kv_used_blocks", "waiting", "running",
               "preempted", "rejected")


class Setting(float):
    """A number in a result section that is a setting, not a counter (a client timeout): the
    sections of a cluster's replicas share it, so their merged section reads it once, not summed."""


@dataclass
class RunResult:
    trace: list                      # TraceRequest, arrival order
    requests: list                   # Request per trace entry (None if it never arrived)
    steps: dict                      # column -> numpy array, one row per executed step
    num_blocks: int
    block_size: int
    policy: str
    status: str = "complete"         # complete | partial
    error: str = ""
    traceback: str = ""              # of the exception that ended a partial run (none for Ctrl-C)
    sections: dict = field(default_factory=dict)   # feature -> what its extension reports (filled
                                     # as the run goes): `forks`, `tool_calls`, `sessions`, `speculation`,
                                     # `kv_tiers`; summary.json's sections are made from them

    @property
    def partial(self) -> bool:
        return self.status != "complete"


def mark_partial(result: RunResult, error: BaseException) -> None:
    """A run that ended early keeps its results, with what stopped it in one line: Ctrl-C or a
    stop signal the app turned into one, a broken contract, or anything a policy or data plane
    raised (even sys.exit; its traceback kept). Call it inside the `except` block (the engine then
    settles what its extensions left in flight: `Engine.stopped`)."""
    result.status = "partial"
    if isinstance(error, KeyboardInterrupt):
        result.error = f"interrupted ({str(error) or 'Ctrl-C'})"
        return
    result.error = f"{type(error).__name__}: {error}"
    if not isinstance(error, ContractViolation):      # a broken contract says it all in one line
        result.traceback = traceback.format_exc()
