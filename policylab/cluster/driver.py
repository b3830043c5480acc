"""The cluster loop: N engines (replicas) on one virtual clock, event by event.

At each turn the earliest thing happens: an arrival (handed to the router at its arrival
time), a P/D event (see `policylab.cluster.disagg`), or the step of the replica whose next step
starts earliest. Ties go to arrivals, then events, then the lowest replica index, so a replay
is deterministic, and a one-replica cluster replays exactly as `Engine.run` (arrivals at or
before a step's start are admitted before it, as DESIGN §2 step 1). Steps are atomic: a router
sees each replica as it was at the end of its last step. Each replica's engine runs its own policy
instance (under P/D, the prefill and decode pools may run different policies); a broken contract
names the policy and the replica whose step broke it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

import numpy as np

from policylab.cluster.config import policy_label
from policylab.cluster.disagg import front_of
from policylab.cluster.result import ClusterResult, ReplicaResult, merged_sections, merged_steps
from policylab.core.contract import ContractViolation
from policylab.core.routing import CapacityView, ClusterView, ReplicaView, RouteRequest, Router, prompt_block_keys, \
    prompt_hash_cache, validate_route
from policylab.core.engine import Engine
from policylab.core.events import ARRIVAL, EVENT, INF, STEP, ArrivalSource, EventQueue
from policylab.core.extensions.sessions import ClosedLoop
from policylab.core.features import check_combination
from policylab.core.gc_freeze import FrozenHeap
from policylab.core.request import Request, Status, forget_done
from policylab.core.result import mark_partial



@dataclass
class Replica:
    index: int
    role: str            # colocated | prefill | decode
    hardware: str
    engine: Engine


class Cluster:
    STRETCH = 4096       # arrivals routed at a time when replicas replay one after the other
    MAX_IDLE_TURNS = 10_000   # turns in a row without progress before the loop is declared stuck

    def __init__(self, trace: list, replicas: list, router: Router, disaggregation=None,
                 observer: Optional[Callable[["Cluster"], None]] = None, sessions=None, migration=None):
        """`trace` sorted by arrival, as every replica's engine was built on it (same indices);
        `observer(cluster)` runs after every turn of the loop (the test harness checks invariants);
        `sessions`: a SessionPlan replayed in closed loop (its turns routed like arrivals);
        `migration`: live migration (`policylab.cluster.migration.LiveMigration`) for a router that
        rebalances."""
        self.observer = observer
        self._idle_turns = 0             # turns in a row that ran no step and moved no clock
        self.trace, self.replicas, self.router = trace, replicas, router
        self.router_name = getattr(router, "name", type(router).__name__)
        pools = {r.role: r.engine.policy_name for r in replicas}     # (one policy per pool)
        self.policy_name = policy_label(replicas[0].engine.policy_name, pools.get("prefill"), pools.get("decode"))
        n = len(trace)
        self.requests: list = [None] * n
        self.placement = {"replica": [-1] * n, "decode_replica": [-1] * n,
                          "transfer_time": [math.nan] * n, "kv_wait": [math.nan] * n}
        self.num_done = 0
        self.events = EventQueue()       # the replay's one queue: arrivals, turns, tool returns, transfers, steps
        self.arrivals = None             # where arrivals come from: the trace's times, or a closed-loop client
        self._forgotten = 0              # requests below this req_id were handed to a writer
        self._on_done = None
        self._rooms: dict = {}           # id(pool) -> (pool tuple, tokens that fit on all of it)
        hashes = prompt_hash_cache(replicas, partial(prompt_block_keys, trace, replicas[0].engine))
        self.views = [ReplicaView(r.index, r.role, r.hardware, r.engine, hashes) for r in replicas]
        self._front = [v for v in self.views if v.role != "decode"]      # who admits arrivals
        self._engines = [r.engine for r in replicas]
        features = set().union(*(e.features for e in self._engines)) | ({"sessions"} if sessions is not None else set()) \
            | ({"migration"} if migration is not None else set())
        for e in self._engines:           # refused here, in one line, if they do not compose in this topology
            check_combination(features, e.capabilities, e.dataplane.kind,
                              "replicas" if disaggregation is None else "pd", e.cfg)
        self._times = [INF] * len(replicas)      # each replica's step on the queue (INF: none)
        for r in replicas:
            r.engine.become_replica(self.events, partial(self._next_event_time, r.engine),
                                    partial(self.refresh, r.index))
        self.pd = disaggregation
        if self.pd is not None:
            self.pd.attach(self)
        self.migration = migration
        self.result = ClusterResult(self.trace, self.requests, {}, sum(e.kv.num_blocks for e in self._engines),
                                    self._engines[0].kv.block_size, self.policy_name, router=self.router_name,
                                    replicas=[ReplicaResult(r.index, r.role, r.hardware, r.engine.result,
                                                            r.engine.policy_name) for r in replicas],
                                    placement=self.placement)
        self.result.sections.update(merged_sections([r.engine.result.sections for r in replicas]))
        if migration is not None:
            migration.attach(self)
        self.client = None
        if sessions is not None:         # a closed-loop client: its turns are this cluster's arrivals
            self.client = ClosedLoop(sessions, replicas[0].engine.prefix_block_tokens)
            self.client.bind(self)
            self.result.sections["sessions"] = self.client.section()

    # ------------------------------------------------------------------ what a client asks of its runner
    def take_arrivals(self, source) -> None:
        self.arrivals = source

    def schedule_arrival(self, time: float, handler: Callable, arg=None) -> None:
        self.events.push(time, ARRIVAL, handler, arg)

    def deliver(self, i: int, t) -> None:
        """Request i (its trace entry `t`, made now) arrives: written where every replica reads it
        (a prefill replica's ends after its first token), then routed."""
        self._write(i, t)
        self._route(i)

    def refuse(self, i: int, reason: str, t) -> None:
        self._write(i, t)
        self._reject(i, reason)

    def request(self, i: int):
        return self.requests[i]

    @property
    def vocab_size(self) -> int:
        return self._engines[0].dataplane.vocab_size

    @property
    def seed(self) -> int:
        return self._engines[0].seed

    def _write(self, i: int, t) -> None:
        self.trace[i] = t
        for rep in self.replicas:
            rep.engine.trace[i] = front_of(t) if rep.role == "prefill" else t

    # ------------------------------------------------------------------ loop
    def run(self, on_request_done: Optional[Callable[[int], None]] = None) -> ClusterResult:
        self._on_done = on_request_done
        for r in self.replicas:
            r.engine.begin(partial(self._finished, r))
        result = self.result
        with FrozenHeap() as heap:
            try:
                self._loop(heap.freeze_if_due)
                for e in self._engines:
                    e.kv.check()
            except (KeyboardInterrupt, Exception) as e:
                mark_partial(result, e)
                self.stopped()
            result.steps = self.steps
        return result

    @property
    def steps(self) -> dict:
        """Every replica's steps (each replica's result holds its own), merged in clock order."""
        for p, e in zip(self.result.replicas, self._engines):
            p.result.steps = e.steps
        return merged_steps(self.result.replicas)

    def _loop(self, freeze_if_due: Callable[[int], None]) -> None:
        """Turns until every request is done: the one loop (`_advance`), the observer called after
        each turn. Under a router that reads no load, with nothing but arrivals on the queue (no
        P/D, closed loop or tool calls) the replicas are independent, and the same turns run grouped
        replica by replica (`_loop_by_replica`): an optimisation, step for step the same replay."""
        if self.pd is None and self.migration is None and self.arrivals is None \
                and not getattr(self.router, "reads_load", True) \
                and not any(e.schedules_events for e in self._engines):
            return self._loop_by_replica(freeze_if_due)
        if self.arrivals is None:
            self.arrivals = ArrivalSource(self.events, self.trace, self._route)
        n, observe = len(self.trace), self.observer
        while self.num_done < n:
            self._advance()
            if observe is not None:
                observe(self)
            freeze_if_due(self.num_done)

    def _loop_by_replica(self, freeze_if_due: Callable[[int], None]) -> None:
        """The loop under a router that reads no load: each replica's steps then depend only on
        the requests routed to it. The trace goes by in stretches of STRETCH arrivals: each is
        routed (in arrival order, as always), then each replica in turn runs its share: the steps
        that start before each of its arrivals (arrivals win ties), then the arrival, just what it
        runs between them in the turn-by-turn loop. An engine then stays in the CPU's caches for
        hundreds of steps rather than one. A replica whose policy waits with work queued sleeps
        until its next delivery in both loops, so the grouping changes nothing."""
        trace, engines, n = self.trace, self._engines, len(self.trace)
        pool = [CapacityView(v, self.router_name) for v in self._front]
        own_next: list = [None] * len(engines)        # each replica's next arrival (None: no more)
        for k, e in enumerate(engines):
            e.wait_for = partial(lambda k: None if own_next[k] is None else INF, k)
            e.on_wake = None
        for start in range(0, n, self.STRETCH):
            shares: list = [[] for _ in engines]
            for i in range(start, min(start + self.STRETCH, n)):
                t = trace[i]
                choice, why = self.choose(self.router, pool, self.route_request(i), t.output_tokens, t.arrival_time)
                if choice is None:
                    self._reject(i, why)
                else:
                    shares[choice].append(i)
            for k, share in enumerate(shares):
                if share:
                    self._replay_share(k, share, own_next, freeze_if_due)
        for k in range(len(engines)):
            own_next[k] = None
            self._replay_share(k, [], own_next, freeze_if_due)
        if self.num_done < n:
            raise self._stalled()

    def _replay_share(self, k: int, share: list, own_next: list, freeze_if_due) -> None:
        """Replica k's steps up to and between its arrivals `share`; with none: until it idles."""
        engine, trace = self._engines[k], self.trace
        if not share:
            engine.asleep = False          # nothing more will come: its policy must run what it holds
        try:
            for i in share or [None]:
                arrival = INF if i is None else trace[i].arrival_time
                if i is not None:
                    own_next[k] = arrival
                while engine.next_step_time() < arrival:
                    steps, now = engine.step_index, engine.clock.now
                    engine.step()
                    self._check_progress(k, steps, now)
                    if self.observer is not None:
                        self.observer(self)
                freeze_if_due(self.num_done)           # (per arrival: often enough)
                if i is not None:
                    self._deliver(k, i)
        except ContractViolation as e:
            raise self._on_replica(e, k) from None

    def _advance(self) -> None:
        """One turn: the earliest event of the queue (arrivals, then transfers, then replica steps,
        at one instant). With nothing on it, sleeping replicas are woken: their policies must run
        what they hold (or break work conservation)."""
        if not self.events:
            sleeping = [k for k, e in enumerate(self._engines) if e.asleep]
            if not sleeping:
                raise self._stalled()
            for k in sleeping:
                self._engines[k].asleep = False
                self.refresh(k)
            self._idle_turns = 0
            return
        time, handler, arg = self.events.pop()
        handler(arg, time)
        if handler != self._step:
            self._idle_turns = 0

    def _step(self, k: int, time: float) -> None:
        """Replica k's step, if it is still the one on the queue for it (a stale entry is skipped)."""
        if self._times[k] != time:
            return
        self._times[k] = INF
        engine = self._engines[k]
        steps = engine.step_index
        try:
            engine.step()
        except ContractViolation as e:
            raise self._on_replica(e, k) from None
        self.refresh(k)
        if self.pd is not None:
            self.pd.after_step(self.replicas[k])
        self._check_progress(k, steps, time)

    def _check_progress(self, k: int, steps_before: int, clock_before: float) -> None:
        """Liveness: replica k's step ran nothing and moved no clock. Turns like that in a row mean
        the loop would spin forever at one instant; it stops with an error instead."""
        engine = self._engines[k]
        if engine.step_index != steps_before or engine.clock.now > clock_before:
            self._idle_turns = 0
            return
        self._idle_turns += 1
        if self._idle_turns > self.MAX_IDLE_TURNS:
            raise self._stuck(k, clock_before)

    def _on_replica(self, e: ContractViolation, k: int) -> ContractViolation:
        """The violation, naming the replica whose step broke it (and so which pool's policy)."""
        return ContractViolation(e.policy, e.rule, f"{e.detail} (on {self.replicas[k].role} replica {k})")

    def _stuck(self, k: int, t: float) -> RuntimeError:
        return RuntimeError(f"cluster loop made no progress: {self.MAX_IDLE_TURNS} turns in a row at t={t!r} s "
                            f"ran no step, moved no clock and routed nothing (last: {self.replicas[k].role} "
                            f"replica {k}, next step at {self._engines[k].next_step_time()!r} s); "
                            f"{len(self.trace) - self.num_done} requests unfinished")

    def _stalled(self) -> RuntimeError:
        return RuntimeError(f"cluster stalled with {len(self.trace) - self.num_done} requests unfinished: "
                            "no replica has work and nothing is due to arrive")

    def stopped(self) -> None:
        """The run stopped early: every replica settles what its extensions left in flight."""
        for e in self._engines:
            e.stopped()

    def forget(self, stop: int) -> None:
        """Drop the finished and rejected requests with req_id < `stop`, here and on every replica,
        once a results writer has taken them (as `Engine.forget`: memory then grows with the
        requests in flight, not with the run)."""
        for e in self._engines:
            e.forget(stop)
        forget_done(self.requests, self._forgotten, stop)
        self._forgotten = max(self._forgotten, stop)

    def refresh(self, index: int) -> None:
        """Replica `index` may step at a new time (it stepped, or got work from outside its step):
        its step goes on the queue (the one there before, if any, is then stale)."""
        t = self._engines[index].next_step_time()
        if t != self._times[index]:
            self._times[index] = t
            if t < INF:
                self.events.push(t, STEP, self._step, index, order=index)
                if self.migration is not None:      # (a rebalancer is asked while work is in flight)
                    self.migration.wake(t)

    def push(self, time: float, handle: Callable, arg) -> None:
        """Schedule `handle(arg, time)` (P/D handoffs and transfers)."""
        self.events.push(time, EVENT, handle, arg)

    def _next_event_time(self, engine: Engine) -> Optional[float]:
        """For a replica whose policy waits for something to arrive: INF while anything can still
        reach it (it sleeps until a delivery wakes it, in either loop): an event on the queue, or
        another replica's step (it may hand a request over, or finish a session's turn). None when
        nothing can: every other replica waits too, so this one must run what it holds (or it breaks
        work conservation)."""
        if self.events or any(t < INF for t, e in zip(self._times, self._engines) if e is not engine):
            return INF
        return None

    # --------------------------------------------------------------- routing
    def route_request(self, i: int, prefilled: bool = False) -> RouteRequest:
        t = self.trace[i]
        return RouteRequest(i, t.arrival_time, t.prompt_tokens, t.max_tokens, t.client, t.priority,
                            t.ttft_slo, t.tpot_slo, t.prefix_hashes, prefilled)

    def choose(self, router: Router, pool: list, request: RouteRequest, output_tokens: int, now: float):
        """The replica `router` picks for `request` among those of `pool` that can ever hold it
        (validated), or the reason why none can."""
        everyone, room = self._pool_room(pool)
        total = request.prompt_tokens + output_tokens
        eligible = everyone if total <= room else tuple(v for v in pool if not v.never_fits(request, output_tokens))
        if not eligible:
            biggest = max(pool, key=lambda v: (v.num_total_blocks, -v.index))
            return None, f"no replica can ever hold it (largest: {biggest.never_fits(request, output_tokens)})"
        choice = router.route(request, ClusterView(now, eligible))
        validate_route(self.views, eligible, request, choice, getattr(router, "name", type(router).__name__),
                       output_tokens)
        return choice, ""

    def _pool_room(self, pool: list) -> tuple:
        """(the pool as a tuple, the most tokens a request may have to fit on every replica of it):
        the usual request skips the per-replica check. Replicas never change size."""
        key = id(pool)
        if key not in self._rooms:
            self._rooms[key] = (tuple(pool), min(min(v.max_model_len, v.num_total_blocks * v.block_size)
                                                 for v in pool))
        return self._rooms[key]

    def _route(self, i: int, _time: float = 0.0) -> None:
        t, request = self.trace[i], self.route_request(i)
        needs = self.pd.front_output_tokens(i) if self.pd is not None else t.output_tokens
        why = self.pd.never_fits_decode(request) if self.pd is not None else ""
        choice, why = (None, why) if why else self.choose(self.router, self._front, request, needs, t.arrival_time)
        if choice is None:
            return self._reject(i, why)
        self._deliver(choice, i)

    def _deliver(self, k: int, i: int) -> None:
        """Request i arrives on replica k."""
        engine = self._engines[k]
        engine.deliver(i)
        self.requests[i] = engine.requests[i]
        self.placement["replica"][i] = k

    def _reject(self, i: int, reason: str) -> None:
        t = self.trace[i]
        self.requests[i] = Request(i, t.arrival_time, np.empty(0, np.int32), t.max_tokens or 1, t.client,
                                   t.priority, t.ttft_slo, t.tpot_slo, status=Status.REJECTED,
                                   reject_reason=reason, finish_time=t.arrival_time)
        self.done(i)

    def _finished(self, replica: Replica, req_id: int) -> None:
        if replica.role == "prefill" and self.pd.hand_off(replica, req_id):
            return
        self.done(req_id)

    def done(self, req_id: int) -> None:
        self.num_done += 1
        if self.client is not None:
            self.client.on_request_done(req_id)
        if self._on_done:
            self._on_done(req_id)
