"""Closed-loop clients: arrivals that depend on completions (multi-turn sessions, N concurrent users).

A `SessionPlan` lists every turn of every session, in request-id order; a `ClosedLoopClient`
decides when each one arrives. Turn k+1 of a session arrives `think_time` after turn k
finished, with the conversation so far as its prompt: turn k's real prompt ids, then the
tokens turn k actually generated, then its own new tokens, so the prefix cache hashes (and a
router's prefix lookups) see exactly the reuse a chat client causes. A rejected turn ends its
session: the later turns are rejected with a reason naming it. With `concurrency=N` the
sessions (an open-loop trace: one turn each) are run by N users, each starting its next
session the moment its last one ended; the recorded start times are then not used.

The client drives an `Engine` (`attach`: the engine's `_admit` takes its due arrivals, its
`_done` reports completions) or a `Cluster` (its loop routes the client's arrivals at their
time, its `done` reports completions): one event order for both, so a one-replica cluster and
an engine replay a closed loop alike.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from policylab.core.request import Status, TraceRequest
from policylab.core.synthetic_prompts import synthesize_prompt

INF = math.inf


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

    def __post_init__(self):
        n = len(self.trace)
        if not (len(self.session) == len(self.turn) == len(self.think_time) == len(self.new_tokens) == n):
            raise ValueError("session plan: every per-request list must have one entry per request")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"trace.concurrency must be >= 1 closed-loop users, got {self.concurrency}")
        self.firsts = [i for i in range(n) if self.turn[i] == 0]       # each session's turn 0

    def has_next(self, i: int) -> bool:
        return i + 1 < len(self.trace) and self.turn[i + 1] == self.turn[i] + 1 and \
            self.session[i + 1] == self.session[i]

    @property
    def mode(self) -> str:
        """One line for the summary: how arrivals were made."""
        if self.concurrency is not None:
            return (f"closed loop: {self.concurrency} users, each sends its next request when its last one "
                    "finished (the trace's arrival times are ignored)")
        return "closed loop: each session starts at its recorded time; a turn arrives its think time " \
               "after the previous one finished"


class ClosedLoopClient:
    """The arrival source of a closed-loop replay (see the module docstring)."""

    def __init__(self, plan: SessionPlan, vocab_size: int, seed: int, prefix_block_tokens: int):
        self.plan, self.vocab_size, self.seed, self.pbt = plan, vocab_size, seed, prefix_block_tokens
        self._due: list = []             # (time, sequence, req_id, reason): turns due to arrive or be refused
        self._sequence = 0
        self._in_flight = 0              # delivered turns not done yet
        self._refused: set = set()       # turns refused (their session ended), not yet reported done
        self._conversation: dict = {}    # req_id of the next turn -> ids of the conversation before it
        self._ended: dict = {}           # session -> why it ended early (its later turns are refused)
        self._holders: list = []         # (trace list, transform) to write an arriving turn into
        self._requests = None            # req_id -> Request (the engine's or the cluster's list)
        self._queue = list(plan.firsts)  # sessions not started yet (start order)
        if plan.concurrency is None:
            for i in self._queue:
                self._push(plan.trace[i].arrival_time, i)
            self._queue = []
        else:
            self._queue.reverse()        # (popped from the end)
            for _ in range(min(plan.concurrency, len(self._queue))):
                self._push(0.0, self._queue.pop())

    # ------------------------------------------------------------- wiring
    def bind(self, requests: list, holders: list) -> None:
        """`requests`: the driver's req_id -> Request list; `holders`: (trace list, transform)
        pairs every arriving turn's TraceRequest is written into (the driver's and each engine's)."""
        self._requests, self._holders = requests, holders

    # ------------------------------------------------------------- driver side
    def next_time(self) -> float:
        """When the next turn is due (INF: none is scheduled yet)."""
        return self._due[0][0] if self._due else INF

    def pending(self) -> bool:
        """More turns can still arrive (scheduled, or after a turn in flight finishes)."""
        return bool(self._due) or self._in_flight > 0

    def next_arrival_time(self) -> Optional[float]:
        """For a single engine whose policy waits: the next due time, or None when no turn is
        scheduled (what is in flight runs on this engine, so only its policy can make more come)."""
        t = self.next_time()
        return None if t == INF else t

    def pop(self) -> tuple:
        """(req_id, reason) of the turn due first: reason "" to deliver it (its TraceRequest, with
        its arrival time and prompt, now written into every holder), else why it is refused."""
        time, _, i, reason = heapq.heappop(self._due)
        t = self.plan.trace[i]
        if reason:
            t = dataclasses.replace(t, arrival_time=time)
            self._refused.add(i)
        else:
            self._in_flight += 1
            ids = self._prompt_ids(i)
            t = dataclasses.replace(t, arrival_time=time) if ids is None else \
                dataclasses.replace(t, arrival_time=time, prompt_tokens=len(ids), prompt_ids=ids)
        for trace, transform in self._holders:
            trace[i] = transform(t) if transform else t
        return i, reason

    def admit(self, engine) -> None:
        """A single engine's admission: every turn due by its clock arrives (or is refused)."""
        now = engine.clock.now
        while self._due and self._due[0][0] <= now:
            i, reason = self.pop()
            if reason:
                engine.refuse(i, reason)
            else:
                engine.deliver(i)

    def finished(self, req_id: int) -> None:
        """Request `req_id` is done (finished or rejected): schedule what follows it."""
        r, plan = self._requests[req_id], self.plan
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
            self._push(now, self._queue.pop())

    # ------------------------------------------------------------- internals
    def _push(self, time: float, i: int, reason: str = "") -> None:
        heapq.heappush(self._due, (time, self._sequence, i, reason))
        self._sequence += 1

    def _prompt_ids(self, i: int) -> Optional[np.ndarray]:
        """The prompt of turn i: the conversation before it plus its new tokens (a session's turn 0:
        its own tokens, real ids so that its KV blocks are hashed for the next turn). None: a
        one-turn session keeps the engine's own prompt synthesis (an open-loop request's prompt)."""
        plan, t = self.plan, self.plan.trace[i]
        before = self._conversation.pop(i, None)
        if before is None:
            if not plan.has_next(i):
                return None
            return synthesize_prompt(i, t.prompt_tokens, t.prefix_hashes, self.vocab_size, self.seed, self.pbt)
        new = synthesize_prompt(i, plan.new_tokens[i], (), self.vocab_size, self.seed, self.pbt)
        return np.concatenate([before, new])


def attach(runner, plan: SessionPlan) -> ClosedLoopClient:
    """Make `runner` (an Engine or a Cluster built on `plan.trace`) replay `plan` in closed loop;
    its `run()` then replays the sessions. Returns the client (also `runner.arrivals`)."""
    replicas = getattr(runner, "replicas", None)
    engines = [rep.engine for rep in replicas] if replicas is not None else [runner]
    if any(len(e.trace) != len(plan.trace) for e in engines):
        raise ValueError("closed loop: the engines were not built on the session plan's trace")
    first = engines[0]
    client = ClosedLoopClient(plan, first.dataplane.vocab_size, first.seed, first.prefix_block_tokens)
    holders = [(rep.engine.trace, _front if rep.role == "prefill" else None) for rep in replicas or ()]
    client.bind(runner.requests, holders + [(runner.trace, None)])
    if replicas is not None:
        runner.take_arrivals_from(client)
    else:
        runner.arrivals = client
        runner.take_arrivals_from(client.next_arrival_time)
    return client


def _front(t: TraceRequest) -> TraceRequest:
    """A prefill replica's view of a request: it ends after its first token (cluster.disagg)."""
    return dataclasses.replace(t, output_tokens=min(t.output_tokens, 1))
