"""What a replay returns: every trace request's fate and the per-step records (DESIGN §6 inputs)."""
from __future__ import annotations

import traceback
from dataclasses import dataclass

from policylab.core.contract import ContractViolation
from policylab.core.forks import settle_stopped

STEP_FIELDS = ("clock", "duration", "batch_size", "prefill_tokens", "decode_tokens",
               "num_prefill_reqs", "num_decode_reqs", "kv_used_blocks", "waiting", "running",
               "preempted", "rejected")


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
    kv_tiers: dict | None = None     # swap and KV-tier counters, when a host tier is configured
    sessions: object | None = None   # the SessionPlan of a closed-loop replay (core.closed_loop)
    speculative: dict | None = None  # speculative-decoding counters (core.speculative), filled as the run goes
    forks: dict | None = None        # parallel samples' counters, when a request asks for them
    programs: object = None          # the run's ToolCalls (per-request and run counters), when
                                     # the trace has tool calls

    @property
    def partial(self) -> bool:
        return self.status != "complete"


def mark_partial(result: RunResult, error: BaseException) -> None:
    """A run that ended early keeps its results, with what stopped it in one line: Ctrl-C or a
    stop signal the app turned into one, a broken contract, or anything a policy or data plane
    raised (even sys.exit; its traceback kept). Call it inside the `except` block. A request
    whose parallel samples or beams are not all done is unfinished (`forks.settle_stopped`)."""
    result.status = "partial"
    settle_stopped(result.requests)
    if isinstance(error, KeyboardInterrupt):
        result.error = f"interrupted ({str(error) or 'Ctrl-C'})"
        return
    result.error = f"{type(error).__name__}: {error}"
    if not isinstance(error, ContractViolation):      # a broken contract says it all in one line
        result.traceback = traceback.format_exc()
