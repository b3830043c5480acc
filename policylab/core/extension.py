"""Engine extensions: every feature beyond DESIGN §2's six-phase loop, declared, not branched on.

An extension (forks and beams, tool calls, closed-loop sessions, speculative decoding, the P/D
hand-off, ...) implements some of the hooks below; the engine calls each hook of the extensions
it was built with, in their order, at fixed points of its loop, and names no feature itself. An
extension changes engine state only through the engine's operations (`EngineOps`), and KV only
through the engine's KV manager. What it needs of the data plane, which other features it
composes with and where it runs (one engine, replicas, P/D) are declared once, in
`policylab.core.features`, and a run is checked against them before it starts.

Hooks (a class overrides what it needs; the engine collects only the overridden ones):

  admission_horizon(now) -> t   the latest event time the step about to be planned sees (a lag:
                                an engine that schedules ahead)
  admission(t) -> str           why trace request `t` can never run here ("" if it can)
  on_arrival(r)                 request `r` arrived (its Request exists, it waits)
  on_start(starting)            requests just started running (their cache hits taken)
  on_tokens(requests, finished, now) -> finished
                                a step's tokens are in: the requests committed one by one this
                                step, the ones that reached their target; returns those that
                                really finished (a tool call pauses some)
  on_finish(r)                  `r` finished, its KV still in its blocks (the P/D hand-off copies it)
  on_done(r) -> Request | None  `r` is done (finished or rejected): the trace request to report,
                                or None while others of its group still run (forks)
  on_request_done(req_id)       a trace request was reported done (closed loop: its next turn)
  after_step(sampled_ids, sampled)   after a step (beam search compares its beams)
  on_stuck() -> str             the plan is empty and the replay cannot go on as it is: "retry"
                                (memory was freed: ask the policy again), "wait" (something
                                this extension scheduled will come), or "" (nothing to offer)
  on_stopped()                  the run stopped early (a broken contract, a signal): settle what is
                                in flight (forks: a request with samples to go is unfinished)
  section() -> value            what `RunResult.sections[name]` holds for this run

An extension that carries out a `StepPlan` field (`plan_field`: speculation's `spec_tokens`)
also implements `widen(chunks, field_value) -> chunks`, `mark(batch, requests, field_value)` and
`verify(requests, batch, result, now) -> (query_lens, sampled)`: a plan using the field is
committed entry by entry through them.
"""
from __future__ import annotations

HOOKS = ("admission_horizon", "admission", "on_arrival", "on_start", "on_tokens", "on_finish", "on_done", "on_request_done",
         "after_step", "on_stuck", "on_stopped")


class Extension:
    name = ""                  # its feature's name (policylab.core.features.FEATURES)
    plan_field = None          # a StepPlan field it carries out (None: none): see `claim`
    shares_kv = False          # its requests share KV blocks (the KV manager copies them on write)
    schedules_events = False   # it puts events of its own on the replay's queue

    def claim(self, value):
        """The part of this plan's `plan_field` value to carry out (falsy: none, the plan is plain)."""
        return value

    def bind(self, ops) -> None:
        """Called once by the engine it extends: `ops` is that engine's operations."""
        self.ops = ops

    def section(self):
        """This run's `RunResult.sections[self.name]` (None: nothing to report)."""
        return None


def hooks_of(extensions, name: str) -> tuple:
    """The bound `name` hooks of the extensions that implement it, in order."""
    return tuple(getattr(e, name) for e in extensions if getattr(type(e), name, None) is not None)


EXTENSION_FIELDS = ("spec_tokens",)     # StepPlan fields an engine extension carries out (speculation)


def unowned_field(plan, owned) -> str:
    """The first extension field `plan` sets that none of `owned` ((field, extension) pairs) carries
    out ("" when none): such a plan cannot run on that engine."""
    mine = {field for field, _ in owned}
    for field in EXTENSION_FIELDS:
        value = getattr(plan, field)
        if field not in mine and value and any(value.values()):
            return field
    return ""
