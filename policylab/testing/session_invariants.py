"""The invariants of a closed-loop replay (docs/sessions.md), checked on its result:

- a session's turns keep their order and never overlap: turn k+1 arrives no earlier than
  turn k finished plus its think time (a refused turn: when the one before it ended);
- a turn's prompt extends the conversation: the previous turn's prompt ids, then the ids it
  actually generated, then the turn's own new tokens;
- a rejected turn ends its session: every later turn is rejected, naming the session;
- with N closed-loop users, never more than N requests are in flight at once;
- every turn ends finished or rejected with a reason.
"""
from __future__ import annotations

import numpy as np

from policylab.core.request import Status
from policylab.testing.properties import InvariantViolation

EPS = 1e-9


def check_sessions(result, plan, policy: str = "") -> None:
    """Raise InvariantViolation naming the first broken session invariant."""
    def fail(invariant: str, detail: str):
        raise InvariantViolation(invariant, detail, policy)

    reqs = result.requests
    for i, r in enumerate(reqs):
        if r is None or r.status not in (Status.FINISHED, Status.REJECTED):
            fail("liveness", f"turn {plan.turn[i]} of session {plan.session[i]} (request {i}) did not end")
        if r.status is Status.REJECTED and not r.reject_reason:
            fail("liveness", f"request {i} was rejected without a reason")
        if plan.turn[i] == 0:
            continue
        prev = reqs[i - 1]
        if prev.status is Status.REJECTED:
            if r.status is not Status.REJECTED or f"session {plan.session[i]} ended" not in r.reject_reason:
                fail("session_order", f"turn {plan.turn[i]} of session {plan.session[i]} ran after turn "
                     f"{plan.turn[i - 1]} was rejected ({r.status.value}: {r.reject_reason!r})")
            if r.arrival_time < prev.finish_time - EPS:
                fail("session_order", f"request {i} was refused before its session ended")
            continue
        due = prev.finish_time + plan.think_time[i]
        if r.arrival_time < due - EPS:
            fail("session_order", f"turn {plan.turn[i]} of session {plan.session[i]} arrived at "
                 f"{r.arrival_time!r} s, before turn {plan.turn[i - 1]} finished ({prev.finish_time!r} s) "
                 f"plus its think time ({plan.think_time[i]!r} s)")
        if r.status is Status.REJECTED and not len(r.prompt_ids):
            continue
        history = np.concatenate([np.asarray(prev.prompt_ids, dtype=np.int32),
                                  np.asarray(prev.output_ids, dtype=np.int32)])
        prompt = np.asarray(r.prompt_ids, dtype=np.int32)
        if len(prompt) != len(history) + plan.new_tokens[i] or not np.array_equal(prompt[:len(history)], history):
            fail("session_prompt", f"turn {plan.turn[i]} of session {plan.session[i]}: its prompt "
                 f"({len(prompt)} tokens) is not the conversation so far ({len(history)} tokens) plus its "
                 f"{plan.new_tokens[i]} new tokens")
    if plan.concurrency is not None:
        _check_concurrency(reqs, plan.concurrency, fail)


def _check_concurrency(reqs: list, users: int, fail) -> None:
    """At most `users` requests between arrival and end at any time (an end frees a user before
    an arrival at the same instant: the next request is sent when the last one finished)."""
    events = sorted([(r.arrival_time, 1) for r in reqs] + [(r.finish_time, -1) for r in reqs],
                    key=lambda e: (e[0], e[1]))
    live = 0
    for t, change in events:
        live += change
        if live > users:
            fail("concurrency", f"{live} requests in flight at {t!r} s with {users} closed-loop users")
