"""An engine's requests, in and out, and what a driver asks of it (DESIGN §2 admit, §3).

A request arrives (from the trace's times, a closed-loop client, or a cluster's router), is
rejected with a reason when it can never run, waits, runs, and is done: finished or rejected.
A driver (a lone engine's own `run`, or a cluster) delivers arrivals and prefilled requests,
steps the engine while it has work, and hears when each request is done. The extensions hook
into arrival (`admission`, `on_arrival`) and completion (`on_done`, `on_request_done`) here.
"""
from __future__ import annotations

import math
from array import array
from typing import Callable, Optional

import numpy as np

from policylab.core.admission import never_fits, output_cap, predict_output
from policylab.core.contract import RequestView
from policylab.core.events import EventQueue
from policylab.core.extension import EXTENSION_FIELDS, HOOKS, hooks_of
from policylab.core.kv import chain_hashes
from policylab.core.request import FINISHED, NO_TOKENS, REJECTED, Request, TraceRequest, forget_done
from policylab.core.result import RunResult
from policylab.core.synthetic_prompts import SyntheticPrompt, synthesize_prompt

ROUTED = "routed"       # a replica's arrivals: delivered by its cluster's router


class Lifecycle:
    """The engine's requests in and out, and its driver's interface (a base of `Engine`)."""

    def _collect_hooks(self) -> None:
        exts = self.extensions
        self._admission_horizon, self._admission, self._on_arrival, self._on_start, self._on_tokens, self._on_finish, self._on_done_hooks, \
            self._on_request_done, self._after_step, self._on_stuck, self._on_stopped = (hooks_of(exts, h) for h in HOOKS)
        self._plan_fields = tuple((e.plan_field, e) for e in exts if e.plan_field)
        # a plan can set a field none of them carries out (else a plain plan needs no look for one)
        self._fields_unowned = not set(EXTENSION_FIELDS) <= {field for field, _ in self._plan_fields}

    def extend(self, ext) -> None:
        """Run one more extension (a driver's, before the run starts: the P/D hand-off)."""
        self.extensions += (ext,)
        self._collect_hooks()
        self._attach(ext)

    def _attach(self, ext) -> None:
        """Bind `ext` to this engine's ops; its section of the result, if it reports one."""
        ext.bind(self.ops)
        section = ext.section()
        if section is not None:
            self.result.sections[ext.name] = section

    def extension(self, name: str):
        """The extension of feature `name` this engine runs (None: it runs none)."""
        return next((e for e in self.extensions if e.name == name), None)

    def _next_event(self) -> Optional[float]:
        return self.events.next_time() if self.events else None

    # ------------------------------------------------------------------ a driver's interface
    def begin(self, on_request_done: Optional[Callable[[int], None]] = None) -> RunResult:
        """Start a run that a driver steps (`step()` while work is left); the result it fills."""
        self._on_done = on_request_done
        return self.result

    def deliver(self, i: int, t: Optional[TraceRequest] = None) -> None:
        """Request i arrives now (`t`: its trace entry, when it was made during the run: a turn)."""
        if t is not None:
            self.trace[i] = t
        self.clock.idle_until(self.trace[i].arrival_time)
        self._arrive(i)
        self.wake()

    def refuse(self, i: int, reason: str, t: Optional[TraceRequest] = None) -> None:
        """Request i never reaches the queue (its session ended): rejected now."""
        if t is not None:
            self.trace[i] = t
        t = self.trace[i]
        self.clock.idle_until(t.arrival_time)
        self.requests[i] = r = Request(i, t.arrival_time, NO_TOKENS, t.max_tokens or 1, t.client, t.priority)
        self._reject(r, reason)

    def receive_prefilled(self, r: Request, target_len: int, front: bool = False) -> None:
        """A request prefilled elsewhere joins the waiting queue with its prompt's KV in
        `r.block_table` (blocks of this cache, taken when its transfer began): it decodes here.
        `front`: ahead of everything waiting, as a preempted request (a migrated one: work begun)."""
        self.requests[r.req_id], self.target_len[r.req_id] = r, target_len
        self.views[r.req_id] = RequestView(r, self.kv)
        if front:
            self._waiting.put_back([r.req_id])
        else:
            self._waiting.append(r.req_id)
        self._arrived.append(r.req_id)
        self.wake()

    def become_replica(self, events: EventQueue, wait_for: Callable[[], Optional[float]],
                       on_wake: Callable[[], None]) -> None:
        """Run as one replica of a cluster: on the cluster's queue, requests delivered by its router
        (`deliver`, `receive_prefilled`), no admission of its own. `wait_for()`: when more can come
        once its policy waits (INF: sleep until woken; None: never), `on_wake()`: it has work again."""
        self.events, self.wait_for, self.on_wake = events, wait_for, on_wake
        self.arrivals, self._admits = ROUTED, False

    @property
    def schedules_events(self) -> bool:
        """Some extension puts events of its own on the queue (a tool's return)."""
        return any(e.schedules_events for e in self.extensions)

    def stopped(self) -> None:
        """The run stopped early: the extensions settle what they left in flight."""
        for hook in self._on_stopped:
            hook()

    def wake(self) -> None:
        if self.asleep:
            self.asleep = False
        if self.on_wake is not None:
            self.on_wake()

    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def next_step_time(self) -> float:
        """When this engine's next step starts: now while requests run or wait and it is awake."""
        return self.clock.now if (self._running or self._waiting) and not self.asleep else math.inf

    @property
    def steps(self) -> dict:
        """Per-step records as columns (STEP_FIELDS -> numpy array)."""
        return self.step_log.columns()

    def forget(self, stop: int) -> None:
        """Drop the finished and rejected requests with req_id < `stop` once a results writer
        has taken what it needs of them (memory then grows with the requests in flight)."""
        forget_done(self.requests, self._forgotten, stop)
        self._forgotten = max(self._forgotten, stop)

    # ------------------------------------------------------------- admit
    def _arrive(self, i: int) -> None:
        t: TraceRequest = self.trace[i]
        cfg = self.cfg
        stop = cfg.length_limit == "stop"              # (run and stop at max_model_len, as vLLM does)
        reason = never_fits(t.prompt_tokens, t.output_tokens, cfg.max_model_len, self.kv.num_blocks,
                            self.kv.block_size, t.max_tokens or cfg.max_tokens, stop)   # by arithmetic: no token or hash
        for check in self._admission:                                            # is built for a request that
            reason = reason or check(t)                                          # can never run
        if reason:
            ids = NO_TOKENS
        elif t.prompt_ids is not None:
            ids = np.asarray(t.prompt_ids, dtype=np.int32)
        else:                            # (ids made again when read, not held, if the plane reads none)
            ids = (synthesize_prompt if self._token_ids else SyntheticPrompt)(
                i, t.prompt_tokens, t.prefix_hashes, self.dataplane.vocab_size, self.seed, self.prefix_block_tokens)
        max_tokens = t.max_tokens or cfg.max_tokens or max(cfg.max_model_len - t.prompt_tokens, 1)
        if stop:
            max_tokens = max(min(max_tokens, output_cap(t.prompt_tokens, cfg.max_model_len, stop)), 1)
        r = Request(i, t.arrival_time, ids, max_tokens, t.client, t.priority, t.ttft_slo,
                    t.tpot_slo, predict_output(cfg, self._rng, t.output_tokens), self.sampling)
        self.requests[i] = r
        self.target_len[i] = min(t.output_tokens, max_tokens)
        for hook in self._on_arrival:
            hook(r)
        if reason:
            return self._reject(r, reason)
        if self.kv.prefix_caching:                   # 8 bytes a hash; none yet for a prompt of its
            r.own_prompt = t.own_prompt                  # own (keyed when preemption publishes it)
            r.block_hashes = array("Q") if r.own_prompt else array("Q", chain_hashes(np.asarray(ids),
                                                                                     self.kv.block_size))
        self.views[i] = RequestView(r, self.kv)
        self._waiting.append(i)
        self._arrived.append(i)

    def _reject(self, r: Request, reason: str) -> None:
        if r.block_table:          # waiting with KV: prefilled elsewhere (receive_prefilled)
            self.release(r)
        if r.swapped_blocks:       # waiting with its KV in swap space
            self.kv.drop_swapped(r)
        r.status, r.reject_reason, r.finish_time = REJECTED, reason, self.clock.now
        self._done(r)

    def _done(self, r: Request) -> None:
        view = self.views.pop(r.req_id, None)
        for hook in self._on_done_hooks:             # a group's member: the group is done with its last
            r = hook(r)
            if r is None:
                return self.policy.on_finished(view) if view is not None else None
        self.num_done += 1
        if view is not None:
            self.policy.on_finished(view)
        for hook in self._on_request_done:
            hook(r.req_id)
        if self._on_done:
            self._on_done(r.req_id)

    def release(self, r: Request) -> None:
        """Free the request's KV (its computed blocks published first): it leaves the decoding sets."""
        self.kv.free(r, r.own_prompt and r.status is FINISHED)
        self._decoding.discard(r.req_id)

