"""Closed-loop clients: arrivals that depend on completions (multi-turn sessions, N concurrent users).

A `SessionPlan` lists every turn of every session, in request-id order; a `ClosedLoopClient`
decides when each one arrives. Turn k+1 of a session arrives `think_time` after turn k
finished, with the conversation so far as its prompt: turn k's real prompt ids, then the
tokens turn k actually generated, then its own new tokens, so the prefix cache hashes (and a
router's prefix lookups) see exactly the reuse a chat client causes. A rejected turn ends its
session: the later turns are rejected with a reason naming it. With `concurrency=N` the
sessions (an open-loop trace: one turn each) are run by N users, each starting its next
session the moment its last one ended; the recorded start times are then not used.

The client is an extension of whoever replays it: an engine (its turns delivered to the engine)
or a cluster (routed at their time like any arrival). Its turns are events of the replay's one
queue in both, so a one-replica cluster and an engine replay a closed loop alike.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import numpy as np

from policylab.core.extension import Extension
from policylab.core.request import Status
from policylab.core.synthetic_prompts import synthesize_prompt


@dataclass
class SessionPlan:
    """Every turn of a session workload, one entry per request id (sessions in start order, each
    session's turns consecutive). `trace[i]` is a placeholder until turn i arrives: its arrival
    time is its session's start, its prompt length the conversation it would have if every turn
    generated exactly its output tokens; the client writes the real ones when it arrives."""
    trace: list                      # TraceRequest per request id (arrival order: what engines are built on)
    session: list                    # session label per request id
    turn: list                       # turn index per request id
    think_time: list                 # s after the previous turn finished (turn 0: 0.0)
    new_tokens: list                 # prompt tokens the turn adds to the conversation
    concurrency: Optional[int] = None   # N closed-loop users; None: sessions start at their recorded time
    user_gap: float = 0.0            # s a closed-loop user waits between a session's end and its next one
    #                                  (a client's round trip: it learns of the end, its request travels)
    paced: bool = False              # closed-loop users start no session before its recorded start (a load
    #                                  generator's requests at their times, at most N of them in flight)

    def __post_init__(self):
        n = len(self.trace)
        if not (len(self.session) == len(self.turn) == len(self.think_time) == len(self.new_tokens) == n):
            raise ValueError("session plan: every per-request list must have one entry per request")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"trace.concurrency must be >= 1 closed-loop users, got {self.concurrency}")
        if not 0.0 <= self.user_gap < float("inf"):
            raise ValueError(f"session plan: user_gap must be a finite number of seconds >= 0, got {self.user_gap}")
        self.firsts = [i for i in range(n) if self.turn[i] == 0]       # each session's turn 0

    def has_next(self, i: int) -> bool:
        return i + 1 < len(self.trace) and self.turn[i + 1] == self.turn[i] + 1 and \
            self.session[i + 1] == self.session[i]

    @property
    def mode(self) -> str:
        """One line for the summary: how arrivals were made."""
        if self.concurrency is not None and self.paced:
            return (f"closed loop: at most {self.concurrency} requests in flight, each sent at its arrival time "
                    "or when one of them finished, whichever is later")
        if self.concurrency is not None:
            gap = f" and {self.user_gap * 1e3:g} ms" if self.user_gap else ""
            return (f"closed loop: {self.concurrency} users, each sends its next request when its last one "
                    f"finished{gap} (the trace's arrival times are ignored)")
        return "closed loop: each session starts at its recorded time; a turn arrives its think time " \
               "after the previous one finished"


class ClosedLoop(Extension):
    """The arrival source of a closed-loop replay (see the module docstring): its turns are events
    of the replay's queue, delivered to the runner it is bound to (an engine's operations, or a
    cluster: `schedule_arrival`, `deliver`, `refuse`, `request`, `vocab_size`, `seed`)."""

    name = "sessions"

    def __init__(self, plan: SessionPlan, prefix_block_tokens: int):
        self.plan, self.pbt = plan, prefix_block_tokens
        self._in_flight = 0              # delivered turns not done yet
        self._refused: set = set()       # turns refused (their session ended), not yet reported done
        self._conversation: dict = {}    # req_id of the next turn -> ids of the conversation before it
        self._ended: dict = {}           # session -> why it ended early (its later turns are refused)
        self._queue = list(plan.firsts)  # sessions not started yet (start order)
        self._scheduled = 0              # turns on the queue, not yet due

    def bind(self, runner) -> None:
        """Become the arrival source of `runner`, and put the first turns on its queue."""
        super().bind(runner)
        runner.take_arrivals(self)
        plan = self.plan
        if plan.concurrency is None:
            for i in self._queue:
                self._push(plan.trace[i].arrival_time, i)
            self._queue = []
        else:
            self._queue.reverse()        # (popped from the end)
            for _ in range(min(plan.concurrency, len(self._queue))):
                i = self._queue.pop()
                self._push(plan.trace[i].arrival_time if plan.paced else 0.0, i)

    def section(self):
        return self.plan

    def pending(self) -> bool:
        """More turns can still arrive (scheduled, or after a turn in flight finishes)."""
        return self._scheduled > 0 or self._in_flight > 0

    # ------------------------------------------------------------- events
    def _push(self, time: float, i: int, reason: str = "") -> None:
        self._scheduled += 1
        self.ops.schedule_arrival(time, self._turn, (i, reason))

    def _turn(self, arg: tuple, time: float) -> None:
        """Turn i is due: delivered (its TraceRequest written now, with its arrival time and the
        conversation as its prompt), or refused with `reason`."""
        i, reason = arg
        self._scheduled -= 1
        t = self.plan.trace[i]
        if reason:
            self._refused.add(i)
            return self.ops.refuse(i, reason, dataclasses.replace(t, arrival_time=time))
        self._in_flight += 1
        ids = self._prompt_ids(i)
        t = dataclasses.replace(t, arrival_time=time) if ids is None else \
            dataclasses.replace(t, arrival_time=time, prompt_tokens=len(ids), prompt_ids=ids)
        self.ops.deliver(i, t)

    def on_request_done(self, req_id: int) -> None:
        """Request `req_id` is done (finished or rejected): schedule what follows it."""
        r, plan = self.ops.request(req_id), self.plan
        if r is None:
            return
        session = plan.session[req_id]
        if req_id in self._refused:
            self._refused.discard(req_id)
        else:
            self._in_flight -= 1
        now = r.finish_time if r.finish_time is not None else plan.trace[req_id].arrival_time
        if plan.has_next(req_id):
            nxt = req_id + 1
            if r.status is Status.FINISHED:
                self._conversation[nxt] = np.concatenate([np.asarray(r.prompt_ids, dtype=np.int32),
                                                          np.asarray(r.output_ids, dtype=np.int32)])
                return self._push(now + plan.think_time[nxt], nxt)
            if session not in self._ended:
                self._ended[session] = (f"session {session} ended: turn {plan.turn[req_id]} was rejected "
                                        f"({r.reject_reason or 'unfinished'})")
            return self._push(now, nxt, self._ended[session])
        self._ended.pop(session, None)
        if self._queue:                  # (closed-loop users only) this user starts its next session
            i = self._queue.pop()
            start = now + plan.user_gap
            self._push(max(start, plan.trace[i].arrival_time) if plan.paced else start, i)

    def _prompt_ids(self, i: int) -> Optional[np.ndarray]:
        """The prompt of turn i: the conversation before it plus its new tokens (a session's turn 0:
        its own tokens, real ids so that its KV blocks are hashed for the next turn). None: a
        one-turn session keeps the engine's own prompt synthesis (an open-loop request's prompt)."""
        plan, t, ops = self.plan, self.plan.trace[i], self.ops
        before = self._conversation.pop(i, None)
        if before is None:
            if not plan.has_next(i):
                return None
            return synthesize_prompt(i, t.prompt_tokens, t.prefix_hashes, ops.vocab_size, ops.seed, self.pbt)
        new = synthesize_prompt(i, plan.new_tokens[i], (), ops.vocab_size, ops.seed, self.pbt)
        return np.concatenate([before, new])
