"""Live migration of a running request between replicas (Llumnix, OSDI'24 §4.2), as events of the
cluster's one queue.

A router that rebalances (`Router.rebalance_interval`, `Router.rebalance`) is asked every interval,
while work is in flight, which running requests to move (`Migration`: request, source replica,
destination replica). Each move goes as Llumnix's does:

1. **Reserve.** The destination takes blocks for the request's computed tokens up front (`kv.receive`);
   a destination without them refuses the move (counted `refused`), the request stays where it is.
2. **Stages.** The blocks go over the link while the request keeps decoding on the source: the first
   stage copies every block, each later one the blocks written since the previous stage began (the
   last, partly filled block again), the destination reserving those new blocks first (a destination
   that has no more room aborts the move: its reserved blocks freed). A stage takes the link model's
   time for its bytes (`LinkModel.transfer_time`, the same link and KV bytes per token that price a
   P/D hand-off), whole blocks of `block_size` tokens.
3. **Stop and copy.** When at most `stop_copy_blocks` blocks are left to copy (or after `max_stages`
   stages), the request leaves the source's running batch at the end of its current step (it is
   then in no replica's batch: it does not decode), the last blocks are copied, and at the commit
   the source frees its blocks, in the same instant as the request joins the destination's queue in
   front (as a preempted request: work begun), its KV in the reserved blocks. On a plane that holds
   K/V (the torch plane) the contents really move (`kv.export` on the source, written into the
   destination's blocks at the commit), so the destination decodes what the source would have.

A request that finishes, is preempted or stops running on the source before its stop-and-copy
aborts the move (`aborted`). KV is conserved: the source's blocks are freed exactly when the
request is committed on the destination; the request never runs on two replicas (it leaves one
batch before it joins the other's queue). summary.json's `migration` section counts the moves,
stages, blocks and bytes copied, link time and the requests' downtime (stop-and-copy).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from policylab.cluster.link import LinkModel
from policylab.core.extension import Extension
from policylab.core.kv import blocks_for
from policylab.core.request import Status
from policylab.core.routing import ClusterView, Migration, RouteViolation

STATS = ("migrations", "committed", "refused", "aborted", "stages", "blocks_copied", "bytes_copied",
         "copy_time", "downtime", "max_downtime")


@dataclass
class Flight:
    """One move under way."""
    req_id: int
    source: int
    destination: int
    table: list                   # the destination's blocks reserved for it
    preemptions: int              # the request's preemptions when it began (one more: it stopped running)
    began: float
    copied_tokens: int = 0        # tokens whose KV reached the destination (at the end of a stage)
    stage_tokens: int = 0         # tokens the stage under way copies up to
    stages: int = 0
    log: dict = field(default_factory=dict)


class LiveMigration:
    """The cluster's side of live migration: asks the router, runs each move's stages as events."""

    def __init__(self, link: LinkModel, kv_bytes_per_token: float, stop_copy_blocks: int = 1, max_stages: int = 8):
        if stop_copy_blocks < 1 or max_stages < 1:
            raise ValueError(f"migration needs stop_copy_blocks >= 1 and max_stages >= 1, got {stop_copy_blocks} "
                             f"and {max_stages}")
        self.link, self.kv_bytes_per_token = link, kv_bytes_per_token
        self.stop_copy_blocks, self.max_stages = stop_copy_blocks, max_stages
        self.flights: dict = {}       # req_id -> Flight
        self.moves: list = []         # every committed move (its Flight.log), in commit order
        self.stats = dict.fromkeys(STATS, 0)
        self.stats.update(copy_time=0.0, downtime=0.0, max_downtime=0.0)
        self.cluster = None
        self._ticking = False

    def attach(self, cluster) -> None:
        self.cluster = cluster
        self.router = cluster.router
        self.interval = float(cluster.router.rebalance_interval)
        if not self.interval > 0:
            raise ValueError(f"router {cluster.router_name}: rebalance_interval must be > 0 seconds, "
                             f"got {self.interval}")
        self.pool = [v for v in cluster.views if v.role == "colocated"]
        self.block_size = cluster.replicas[0].engine.kv.block_size
        for replica in cluster.replicas:
            replica.engine.extend(MigrationWatch(self, replica.index))
        cluster.result.sections["migration"] = self.stats

    # ------------------------------------------------------------------ the router, every interval
    def wake(self, now: float) -> None:
        """A replica has work: the router is asked again an interval from now (if not already due)."""
        if not self._ticking:
            self._ticking = True
            self.cluster.push(now + self.interval, self._tick, None)

    def _tick(self, _arg, now: float) -> None:
        """Ask the router; carry out its moves. While no replica runs anything the asking stops
        (the next replica with work starts it again), so an idle cluster's queue empties."""
        self._ticking = False
        if not any(r.engine.has_work and not r.engine.asleep for r in self.cluster.replicas):
            return
        view = ClusterView(now, tuple(self.pool), frozenset(self.flights))
        moves = self.router.rebalance(view)
        for m in moves or ():
            self._begin(m, now)
        self.wake(now)

    def _check(self, m) -> None:
        name = self.cluster.router_name
        if not isinstance(m, Migration):
            raise RouteViolation(name, "migration_type", f"rebalance() must return Migrations, got {m!r}")
        indices = [v.index for v in self.pool]
        if m.source not in indices or m.destination not in indices or m.source == m.destination:
            raise RouteViolation(name, "migration_replicas", f"request {m.req_id}: from replica {m.source} to "
                                 f"{m.destination}; both must be replicas of {indices}, and differ")
        if m.req_id in self.flights:
            raise RouteViolation(name, "migration_twice", f"request {m.req_id} is already migrating "
                                 "(view.migrating lists those)")
        engine = self.cluster.replicas[m.source].engine
        r = engine.requests[m.req_id] if 0 <= m.req_id < len(engine.requests) else None
        if r is None or not any(x is r for x in engine.running) or r.num_computed_tokens < len(r.prompt_ids):
            raise RouteViolation(name, "migration_request", f"request {m.req_id} is not decoding on replica "
                                 f"{m.source} (a rebalancer moves one of its running_requests that decodes)")

    # ------------------------------------------------------------------ one move
    def _begin(self, m: Migration, now: float) -> None:
        self._check(m)
        source, dest = (self.cluster.replicas[k].engine for k in (m.source, m.destination))
        r = source.requests[m.req_id]
        self.stats["migrations"] += 1
        if blocks_for(r.num_computed_tokens, self.block_size) > dest.kv.num_free:
            self.stats["refused"] += 1                     # no room reserved: it stays where it is
            return
        f = Flight(m.req_id, m.source, m.destination, dest.kv.receive(r.num_computed_tokens),
                   r.num_preemptions, now)
        f.log = {"req_id": m.req_id, "source": m.source, "destination": m.destination, "began": now}
        self.flights[m.req_id] = f
        self._stage(f, r, now)

    def _copy_time(self, f: Flight, upto: int) -> tuple:
        """(blocks, seconds) of copying the blocks holding tokens [copied_tokens, upto): from the
        first block not yet complete on the destination."""
        blocks = blocks_for(upto, self.block_size) - f.copied_tokens // self.block_size
        return blocks, self.link.transfer_time(blocks * self.block_size * self.kv_bytes_per_token)

    def _reserve(self, f: Flight, upto: int) -> bool:
        """The destination's blocks grown to hold `upto` tokens (False: it has no room)."""
        kv = self.cluster.replicas[f.destination].engine.kv
        if blocks_for(upto, self.block_size) - len(f.table) > kv.num_free:
            return False
        kv.grow(f.table, upto)
        return True

    def _stage(self, f: Flight, r, now: float) -> None:
        upto = r.num_computed_tokens
        if not self._reserve(f, upto):
            return self._abort(f, "destination full")
        blocks, seconds = self._copy_time(f, upto)
        f.stage_tokens, f.stages = upto, f.stages + 1
        f.log.setdefault("stage_log", []).append((now, now + seconds, blocks))
        self._count(blocks, seconds)
        self.stats["stages"] += 1
        self.cluster.push(now + seconds, self._stage_done, f.req_id)

    def _count(self, blocks: int, seconds: float) -> None:
        self.stats["blocks_copied"] += blocks
        self.stats["bytes_copied"] += blocks * self.block_size * self.kv_bytes_per_token
        self.stats["copy_time"] += seconds

    def _running_on_source(self, f: Flight):
        """The request, if it still runs on the source as when its move began (else None)."""
        engine = self.cluster.replicas[f.source].engine
        r = engine.requests[f.req_id]
        if r is None or r.status is not Status.RUNNING or r.num_preemptions != f.preemptions \
                or not any(x is r for x in engine.running):
            return None
        return r

    def _stage_done(self, req_id: int, now: float) -> None:
        f = self.flights.get(req_id)
        if f is None:                                  # (aborted meanwhile: it finished on the source)
            return
        r = self._running_on_source(f)
        if r is None:
            return self._abort(f, "left the source")
        f.copied_tokens = f.stage_tokens
        left = blocks_for(r.num_computed_tokens, self.block_size) - f.copied_tokens // self.block_size
        if left <= self.stop_copy_blocks or f.stages >= self.max_stages:
            return self._stop_and_copy(f, r, now)
        self._stage(f, r, now)

    def _stop_and_copy(self, f: Flight, r, now: float) -> None:
        """The request leaves the source's batch at the end of its current step; its last blocks go."""
        cluster = self.cluster
        source = cluster.replicas[f.source].engine
        start = max(now, source.clock.now)             # (a step under way ends first: it holds the request)
        upto = r.num_computed_tokens
        if not self._reserve(f, upto):
            return self._abort(f, "destination full")
        ops = source.ops
        ops.stop_decoding(r.req_id)
        ops.leave_running([r])
        view = ops.hide(r.req_id)
        r.status = Status.PAUSED
        hook = ops.policy_hook("on_finished")           # (its policy hears it left, as a finished one)
        if hook is not None:
            hook(view)
        cluster.refresh(f.source)
        blocks, seconds = self._copy_time(f, upto)
        f.stage_tokens = upto
        self._count(blocks, seconds)
        f.log.update(stages=f.stages, stop=start, tokens=upto, final_blocks=blocks)
        cluster.push(start + seconds, self._commit, f.req_id)

    def _commit(self, req_id: int, now: float) -> None:
        """The request is on the destination now: the source frees its blocks, the destination queues it."""
        f = self.flights.pop(req_id)
        cluster = self.cluster
        source, dest = cluster.replicas[f.source].engine, cluster.replicas[f.destination].engine
        r = source.requests[req_id]
        payload = source.kv.export(r.block_table[:len(f.table)])
        target = source.ops.target(req_id)
        source.release(r)                              # (its full blocks published in the source's cache)
        source.requests[req_id] = None
        r.block_table, r.status = f.table, Status.WAITING
        dest.kv.received(f.table, payload, r.block_hashes, r.num_computed_tokens)
        dest.clock.idle_until(now)
        dest.receive_prefilled(r, target, front=True)
        cluster.requests[req_id] = r
        source.wake()                                  # (its blocks are free: a policy that waited goes on)
        cluster.refresh(f.source)
        cluster.refresh(f.destination)
        downtime = now - f.log["stop"]
        self.stats["committed"] += 1
        self.stats["downtime"] += downtime
        self.stats["max_downtime"] = max(self.stats["max_downtime"], downtime)
        f.log.update(commit=now, downtime=downtime)
        self.moves.append(f.log)

    def _abort(self, f: Flight, why: str) -> None:
        self.flights.pop(f.req_id, None)
        dest = self.cluster.replicas[f.destination].engine
        dest.kv.release(f.table)
        f.table = []
        if dest.has_work:                              # (its blocks are free: a policy that waited goes on)
            dest.wake()
        self.stats["aborted"] += 1

    # ------------------------------------------------------------------ from the replicas
    def request_done(self, index: int, req_id: int) -> None:
        """A request finished (or was rejected) on replica `index`: a move of it under way stops."""
        f = self.flights.get(req_id)
        if f is not None and f.source == index:
            self._abort(f, "finished")

    def stuck(self, index: int) -> str:
        """Replica `index`'s policy cannot go on (its plan is empty with requests running): the moves
        still staging into it give their reserved blocks back ("retry"); a stop-and-copy under way
        will land ("wait"); else nothing to offer ("")."""
        staging = [f for f in self.flights.values() if f.destination == index and "stop" not in f.log]
        for f in staging:
            self._abort(f, "destination stuck")
        if staging:
            return "retry"
        landing = any(index in (f.source, f.destination) for f in self.flights.values())
        return "wait" if landing else ""     # (the commit frees the source's blocks and wakes it)

    def stopped(self) -> None:
        """The run stopped early: the moves still staging give their reserved blocks back."""
        for f in list(self.flights.values()):
            if "stop" not in f.log:
                self._abort(f, "stopped")


class MigrationWatch(Extension):
    """A replica's side of live migration: it tells the moves when a request is done here."""

    name = "migration_watch"

    def __init__(self, migration: LiveMigration, index: int):
        self.migration, self.index = migration, index

    def on_request_done(self, req_id: int) -> None:
        self.migration.request_done(self.index, req_id)

    def on_stuck(self) -> str:
        return self.migration.stuck(self.index)

    def on_stopped(self) -> None:
        if self.index == 0:
            self.migration.stopped()
