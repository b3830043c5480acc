"""The operations an engine offers its extensions: the one door to engine state (no `engine._x`).

Each operation keeps the engine's own records consistent (the running list and the decoding set,
the waiting queue and what the next view reports as arrived, the live views), so an extension
cannot leave them half-changed.
"""
from __future__ import annotations

from policylab.core.capabilities import Capability
from policylab.core.contract import RequestView
from policylab.core.events import ARRIVAL
from policylab.core.request import RUNNING, Request


class EngineOps:
    __slots__ = ("_e",)

    def __init__(self, engine):
        self._e = engine

    # ------------------------------------------------------------------ facts
    @property
    def now(self) -> float:
        return self._e.clock.now

    @property
    def cfg(self):
        return self._e.cfg

    @property
    def seed(self) -> int:
        return self._e.seed

    @property
    def kv(self):
        """The engine's KV manager."""
        return self._e.kv

    @property
    def vocab_size(self) -> int:
        return self._e.dataplane.vocab_size

    @property
    def capabilities(self) -> frozenset:
        return self._e.capabilities

    @property
    def eos(self):
        """The token that ends a request early (None: lengths come from the trace)."""
        return self._e._eos

    @property
    def step_start(self) -> float:
        """When the last executed step started."""
        return self._e.step_start

    @property
    def num_running(self) -> int:
        return len(self._e._running)

    @property
    def num_waiting(self) -> int:
        return len(self._e._waiting)

    def logprobs(self, rows: list, tokens: list):
        """The log-probabilities the plane gave the last step's sampled `tokens` (at batch `rows`);
        None on a plane that samples no distribution."""
        e = self._e
        return e.dataplane.sampled_logprobs(rows, tokens) if Capability.LOGPROBS in e.capabilities else None

    def trace_request(self, i: int):
        return self._e.trace[i]

    def request(self, i: int) -> Request:
        return self._e.requests[i]

    @property
    def num_requests(self) -> int:
        """Requests so far: the trace's, then any an extension added (forks)."""
        return len(self._e.requests)

    def target(self, i: int) -> int:
        """Request i's hidden output target (ids after the prompt at which it stops)."""
        return self._e.target_len[i]

    def set_target(self, i: int, n: int) -> None:
        self._e.target_len[i] = n

    def waiting_ids(self) -> list:
        return list(self._e._waiting.ids())

    def view(self):
        """A scheduler view of the engine now (for a policy hook an extension asks)."""
        return self._e._view()

    def policy_hook(self, name: str):
        """The policy's hook `name` (None: it has none)."""
        return getattr(self._e.policy, name, None)

    @property
    def policy_name(self) -> str:
        return self._e.policy_name

    # ------------------------------------------------------------------ requests
    def add_request(self, r: Request, target: int) -> None:
        """A request no trace entry made (a fork): it gets the next req_id's slot and a view."""
        e = self._e
        assert r.req_id == len(e.requests), "an added request takes the next req_id"
        e.requests.append(r)
        e.target_len.append(target)
        e.views[r.req_id] = RequestView(r, e.kv)

    def join_running(self, requests: list) -> None:
        """Requests that run from now on, at the end of the running order (a decoding one decodes)."""
        e = self._e
        for r in requests:
            e._decoding.update(r)
        e.running = e._running + requests

    def leave_running(self, requests: list) -> None:
        gone = set(map(id, requests))
        e = self._e
        e.running = [r for r in e._running if id(r) not in gone]

    def requeue(self, ids: list) -> None:
        """Requests that wait again, in front of the queue (as preempted ones), reported arrived."""
        e = self._e
        e._waiting.put_back(ids)
        e._arrived.extend(ids)
        self.wake()

    def hide(self, i: int) -> RequestView:
        """Take request i out of every view (paused); its view, to `show` it again."""
        return self._e.views.pop(i)

    def show(self, i: int, view: RequestView) -> None:
        self._e.views[i] = view

    def evict(self, r: Request, to_host: bool) -> int:
        """Free a request's device KV: copied to swap space, its computed tokens kept (`to_host`), or
        dropped, to be recomputed. Its computed tokens before."""
        e = self._e
        computed = r.num_computed_tokens
        if to_host:
            e.kv.swap_out(r)
        e.release(r)
        r.num_computed_tokens = computed if to_host else 0
        return computed

    def abort(self, i: int, reason: str) -> bool:
        """End request i now, rejected with `reason`, wherever it is (waiting, swapped out or
        running: its KV freed); whether it was still live."""
        e = self._e
        r = e.requests[i]
        if r is None or i not in e.views:
            return False
        if r.status is RUNNING:
            e._decoding.forget_batch()
            self.leave_running([r])
            e.release(r)
        else:
            e._waiting.remove((i,))
        e._reject(r, reason)
        e.wake()
        return True

    def stop_decoding(self, i: int) -> None:
        self._e._decoding.discard(i)

    # ------------------------------------------------------------------ time and arrivals
    def schedule(self, time: float, handler, arg=None) -> None:
        """`handler(arg, time)` at `time`, on the replay's one event queue (as an arrival)."""
        self._e.events.push(time, ARRIVAL, handler, arg)

    schedule_arrival = schedule

    def take_arrivals(self, source) -> None:
        """Arrivals come from `source` (a closed-loop client), not from the trace's times."""
        self._e.arrivals = source

    def deliver(self, i: int, t) -> None:
        """Request i arrives now, `t` its trace entry (made during the run: a session's turn)."""
        self._e.deliver(i, t)

    def refuse(self, i: int, reason: str, t) -> None:
        """Request i never reaches the queue: rejected now with `reason`."""
        self._e.refuse(i, reason, t)

    def wake(self) -> None:
        """Work came from outside a step: the engine steps again."""
        self._e.wake()
