"""The replay engine: schedule → run → postprocess, on one event queue (DESIGN §2).

The engine owns requests, the KV manager and the clock; the policy only plans. Arrivals, and
everything else that happens at a time, come as events of the replay's queue (`events`): a lone
engine runs its own (`run`), a cluster's replicas share the cluster's. Every feature beyond the
loop is an extension the engine iterates (`policylab.core.extension`); none is named here. Every
request of the trace ends finished or rejected with a reason; a run cut short (a broken contract,
a raising policy, Ctrl-C) returns what it has, marked partial.
"""
from __future__ import annotations

import math
from itertools import compress
from operator import attrgetter
from types import MappingProxyType
from typing import Callable, Optional

import numpy as np

from policylab.core.batch import CommittedStep, DataPlane, StepResult, bad_duration, joined
from policylab.core.capabilities import Capability
from policylab.core.clock import make_clock
from policylab.core.config import EngineConfig, check_engine_config
from policylab.core.contract import ContractViolation, SchedulerView, private_copy
from policylab.core.decoding import Decoding, positional_tokens
from policylab.core.engine_ops import EngineOps
from policylab.core.events import INF, ArrivalSource, EventQueue
from policylab.core.extension import unowned_field
from policylab.core.extensions import extensions_for
from policylab.core.features import FEATURES, check_combination, features_of
from policylab.core.gc_freeze import FrozenHeap
from policylab.core.kv import KVManager
from policylab.core.lifecycle import Lifecycle
from policylab.core.liveness import Liveness
from policylab.core.plan_rules import check_plan, entries_after
from policylab.core.policy import Policy
from policylab.core.request import FINISHED, SamplingParams, check_arrivals
from policylab.core.request_steps import RequestSteps
from policylab.core.result import RunResult, mark_partial
from policylab.core.step_log import StepLog
from policylab.core.waiting_queue import QueueView, WaitingQueue

_req_id = attrgetter("req_id")


class Engine(Lifecycle, RequestSteps):
    """One engine's loop. Its requests' way in and out and a driver's interface are `Lifecycle`'s,
    the entries a step commits one by one `RequestSteps`'."""

    def __init__(self, trace: list, policy: Policy, dataplane: DataPlane, cfg: EngineConfig,
                 seed: int = 0, prefix_block_tokens: int = 512,
                 sampling: SamplingParams = SamplingParams(), extensions: Optional[list] = None,
                 events: Optional[EventQueue] = None, sessions=None):
        """`extensions`: the features this engine runs (None: those its trace and config ask for,
        `policylab.core.extensions.extensions_for`, with `sessions`' closed loop when given);
        `events`: the replay's queue (a cluster's; None: the engine's own)."""
        self.trace = sorted(trace, key=lambda t: t.arrival_time)
        check_arrivals(self.trace)
        self.policy, self.dataplane, self.cfg, self.seed = policy, dataplane, cfg, seed
        self.policy_name = getattr(policy, "name", type(policy).__name__)
        self.prefix_block_tokens, self.sampling = prefix_block_tokens, sampling
        check_engine_config(cfg)
        self.capabilities = frozenset(dataplane.capabilities)
        self.features = features_of(self.trace, cfg, policy, sessions) \
            | {e.name for e in (extensions or ()) if e.name in FEATURES}       # refused here if they do not compose
        check_combination(self.features, self.capabilities, dataplane.kind, "engine", cfg)
        self._token_ids = Capability.TOKEN_IDS in self.capabilities
        self.extensions = tuple(extensions_for(self.trace, cfg, self.capabilities, sessions=sessions,
                                               prefix_block_tokens=prefix_block_tokens)
                                if extensions is None else extensions)
        num_blocks = cfg.num_blocks or dataplane.num_kv_blocks(cfg.block_size)
        self.kv = KVManager(num_blocks, cfg, dataplane, seed, sharing=any(e.shares_kv for e in self.extensions))
        dataplane.allocate_kv(num_blocks, cfg.block_size)
        self.clock = make_clock(cfg.clock)
        self.events = EventQueue() if events is None else events
        self.requests: list = [None] * len(self.trace)
        self.target_len: list = [0] * len(self.trace)   # req_id -> output tokens to generate (hidden)
        self.views: dict = {}            # req_id -> RequestView, live requests only
        self._views_ro = MappingProxyType(self.views)
        self._waiting = WaitingQueue(self.views)       # req_ids; changes cost what changed (§2 admit)
        self._waiting_view = QueueView(self._waiting)  # the policies' live, read-only window on it
        self._running: list = []
        self._running_views = ()         # views of running (a new tuple whenever it changes)
        self._running_ids: list = []     # their req_ids, in running order (None: both to rebuild)
        # and the decode batch: it defers its members' tokens where they are the plane's positional ids
        self._decoding = Decoding(self.requests, self.target_len, cfg.block_size, positional_tokens(dataplane, cfg))
        self.asleep = False              # its policy waits for work from outside: no step until woken
        self.wait_for: Callable[[], Optional[float]] = self._next_event   # see `wait`
        self.on_wake: Optional[Callable[[], None]] = None   # a driver's: this engine has work again
        self.num_done = 0
        self._forgotten = 0              # requests below this req_id were handed to a writer
        self.step_index = 0
        self.step_log = StepLog()        # one typed row per executed step, in STEP_FIELDS order
        self._rng = np.random.default_rng(seed)
        self._liveness = Liveness(cfg.max_stall_steps, self.policy_name)
        self._on_done = None
        self._eos = dataplane.eos_token_id if cfg.stop_at_eos else None
        # a plane whose engine schedules one step ahead (vLLM's async scheduling): while requests run,
        # an arrival is first seen by the step after the next (admitted up to the last step's start)
        self.step_start = 0.0            # when the last executed step started
        self._sampled, self._arrived = [], []   # since the last schedule(): req_ids given a token, arrived
        self._timed = self.kv.timed if self.kv.uses_link else None   # link copies, charged to the step
        self._admits = True              # a lone engine admits what its queue has due; a replica does not
        self.arrivals = None             # where arrivals come from (`run`: the trace's; a closed-loop
                                         # client's turns; a driver delivers them to a replica itself)
        self.ops = EngineOps(self)
        self._owner = None               # the extension carrying out the plan being committed
        self._collect_hooks()
        self.result = RunResult(self.trace, self.requests, {}, self.kv.num_blocks, self.kv.block_size,
                                self.policy_name)      # filled as the run goes (a results stream reads it)
        for ext in self.extensions:
            self._attach(ext)
        if self.kv.host_blocks or self.kv.has_tiers:
            self.result.sections["kv_tiers"] = self.kv.stats

    running = property(lambda self: self._running)
    waiting = property(lambda self: [self.requests[rid] for rid in self._waiting.ids()],
                       doc="The waiting requests in queue order (a new list: for checks and tests).")

    @running.setter
    def running(self, value: list) -> None:
        self._running, self._running_ids = value, None
        self._decoding.running_changed()

    def _run_also(self, started: list) -> None:
        """Requests that start running, at the end of the running order. The running ids and views
        follow by appending, into new ones: a view or decode facts handed out keep theirs."""
        self._running = self._running + started
        ids = self._running_ids
        if ids is not None:
            new = list(map(_req_id, started))
            self._running_ids = ids + new
            self._running_views = self._running_views + tuple(map(self.views.__getitem__, new))
        self._decoding.running_changed()

    def _run_no_more(self, finished: list) -> None:
        """Finished requests leave the running order: out of new copies of running, its ids and views
        (identity searches at C level)."""
        running, ids = list(self._running), self._running_ids
        if ids is None:
            for r in finished:
                running.remove(r)
        else:
            ids, views = list(ids), list(self._running_views)
            for r in finished:
                i = running.index(r)
                del running[i], ids[i], views[i]
            self._running_ids, self._running_views = ids, tuple(views)
        self._running = running
        self._decoding.running_changed()

    # ---------------------------------------------------------------- a lone engine's replay
    def run(self, on_request_done: Optional[Callable[[int], None]] = None) -> RunResult:
        """Replay the trace on this engine alone: its own queue's events, and its steps between them."""
        result = self.begin(on_request_done)
        n = len(self.trace)
        with FrozenHeap() as heap:
            try:
                while self.num_done < n:
                    self.step()
                    if not (self._running or self._waiting or self.events) and self.num_done < n:
                        raise RuntimeError(f"replay stalled with {n - self.num_done} requests unfinished: nothing "
                                           "runs, waits or is due to arrive")
                    heap.freeze_if_due(self.num_done)
                self.kv.check()
            except BaseException as e:  # Ctrl-C or a stop signal, a broken contract, a policy or data
                mark_partial(result, e)  # plane that raises (even sys.exit): results so far kept
                self.stopped()
            result.steps = self.steps
        return result

    # ------------------------------------------------------------------ one step
    def step(self) -> None:
        """admit → schedule → run → postprocess (an idle turn when nothing runs or is planned)."""
        self.clock.start_step()
        self.admit()
        committed = self._schedule()
        if committed is not None:
            self._postprocess(committed, self._run(committed))

    def admit(self) -> None:
        """Every event due by now happens: arrivals (a lone engine's come at the trace's times),
        session turns, tool results coming back. (A replica's come from its cluster's loop.)"""
        if not self._admits:
            return
        if self.arrivals is None:
            self.arrivals = ArrivalSource(self.events, self.trace, self.deliver)
        horizon = self.clock.now
        for hook in self._admission_horizon:
            horizon = hook(horizon)
        self.events.run_due(horizon)

    def _run(self, committed: CommittedStep) -> StepResult:
        result = self.dataplane.execute(committed.batch)
        if not 0.0 <= result.duration < math.inf:     # (NaN fails too) a NaN clock would hang
            raise bad_duration(self.dataplane, committed.batch, result.duration)   # the replay forever
        if self._timed is not None:
            result = StepResult(result.sampled, self._timed(result.duration), result.accepted)
        return result

    # ---------------------------------------------------------- schedule
    def _view(self) -> SchedulerView:
        """This step's view. Its decode facts are the decode batch's, made again only when running or
        decoding changed; the copy-on-writes of the decodes are counted every step (their shares change)."""
        kv, decoding = self.kv, self._decoding
        if self._running_ids is None:
            self._running_ids = ids = list(map(_req_id, self._running))
            self._running_views = tuple(map(self.views.__getitem__, ids))
        facts = decoding.facts or decoding.make_facts(self._running_ids)
        if kv.sharing:
            facts.cow = kv.write_copies([(self.requests[i], 1) for i in facts.ids])
        return SchedulerView.from_facts((self.clock.now, self.step_index, self._waiting_view, self._running_views,
                                         decoding.ids, self.cfg.max_num_batched_tokens, self.cfg.max_num_seqs,
                                         kv.block_size, kv.num_free, kv.num_blocks, self._views_ro, self._sampled,
                                         self._arrived, facts, kv.host_free, kv.host_blocks))

    def _schedule(self) -> Optional[CommittedStep]:
        """Ask the policy, validate its plan, commit it: the step to execute (None: nothing runs)."""
        if not self._running and not self._waiting:
            return self._idle()
        view = self._view()
        try:
            plan = private_copy(self.policy.schedule(view), self.policy_name)   # read once: what is
            self._sampled, self._arrived = (), []      # told once                 checked is what runs
            leading = check_plan(view, plan, self.policy_name)     # the view's decodes, first
        except ContractViolation as e:     # say where: the step and the replay time it was planned at
            e.locate(self.step_index, self.clock.now)
            raise
        if not plan.num_scheduled_tokens and not plan.preempt and not plan.reject:
            return self._nothing_planned()
        return self._commit(plan, leading)

    def _nothing_planned(self) -> None:
        """An empty plan: the replay waits for what comes next, unless it could never go on so."""
        if self._running or self.wait_for() is None:
            answer = next((a for a in (hook() for hook in self._on_stuck) if a), "")
            if answer == "retry":
                return None
            if not answer:
                raise ContractViolation(self.policy_name, "work_conservation",
                                        "empty plan while requests wait and nothing else can arrive "
                                        "or run; the replay would never end")
        return self._idle()

    def _idle(self) -> None:
        """Nothing to run now: the clock jumps to the next event (`wait_for`: a time, INF to sleep
        until something wakes this engine, None when nothing can come)."""
        t = self.wait_for()
        self.asleep = t == INF
        if t is not None and not self.asleep:
            self.clock.idle_until(t)

    # ------------------------------------------------------------ commit
    def _commit(self, plan, leading: int = 0) -> Optional[CommittedStep]:
        """Commit a valid plan: without preemptions or rejections its running decodes lead the batch
        on the persistent decode batch (`leading`: the plan's first entries are every decode, in
        running order, as `check_plan` found); every other entry goes one by one (and every entry
        of a plan that uses an extension's field)."""
        sched = plan.num_scheduled_tokens
        owner = extra = None
        for field, ext in self._plan_fields:
            extra = ext.claim(getattr(plan, field))
            if extra:
                owner = ext
                break
        else:
            unowned = self._fields_unowned and unowned_field(plan, self._plan_fields)
            if unowned:
                raise ContractViolation(self.policy_name, "field_unsupported", f"the plan sets `{unowned}`, which "
                                        f"no extension of this engine carries out (data plane "
                                        f"{type(self.dataplane).__name__})")
        self._owner = owner
        if leading and owner is None:
            decodes = self._decoding.facts.ids       # every decode, in running order
            parts = None
            if leading < len(sched):                 # (mostly a running prefill's chunk, a start, or both)
                entries = dict((next(reversed(sched.items())),)) if leading + 1 == len(sched) else \
                    entries_after(sched, leading)
                parts = self._commit_entries(entries)
                if parts is None:
                    parts = self._commit_requests(entries, [], {})
        else:
            decodes, chunks = ([], sched) if owner is not None else self._decoding.split(plan)
            parts = self._commit_requests(owner.widen(chunks, extra) if owner is not None else chunks, plan.preempt,
                                          plan.reject, plan.swap) if chunks or plan.preempt or plan.reject else None
            if owner is not None:
                owner.mark(parts[0], parts[1], extra)
        if self.kv.sharing:                          # a shared block is copied before the step writes it
            self.kv.copy_on_write([(self.requests[rid], n) for rid, n in sched.items()])
        if not decodes:
            if parts is None or not parts[1]:
                return None
            return CommittedStep(parts[0], 0, parts[1], len(plan.preempt), len(plan.reject))
        db = self._decoding.commit(decodes, self.kv, bool(leading), parts is None)
        if self._token_ids:
            db.token_ids = [np.array(r.output_ids[-1:], np.int32) for r in self._decoding.batch_requests]
        if parts is None:
            return CommittedStep(db, len(decodes), [], 0, 0)
        return CommittedStep(joined(db, parts[0]), len(decodes), parts[1], 0, 0)

    # ------------------------------------------------------- postprocess
    def _postprocess(self, step: CommittedStep, result: StepResult) -> None:
        start = self.step_start = self.clock.now
        self.clock.advance(result.duration)
        batch, n, now, sampled = step.batch, step.decodes, self.clock.now, result.sampled
        decoded = self._decoding.batch_ids if n else []   # (the batch's first n, before any member leaves)
        finished = self._decoding.postprocess(sampled, now, self._eos) if n else []   # (its first n are theirs)
        prefill_tokens = n_prefill = 0
        if step.requests:
            query_lens, rest = (batch.query_lens[n:], sampled[n:]) if batch.spec_lens is None else \
                self._owner.verify(step.requests, batch, result, now)      # (drafts accepted)
            more, prefill_tokens, n_prefill = self._postprocess_requests(step.requests, query_lens,
                                                                         batch.sample[n:], rest)
            finished += more
        for hook in self._on_tokens:                 # (forks spawn, tool calls pause)
            finished = hook(step.requests, finished, now)
        for r in finished:
            r.status, r.finish_time = FINISHED, now
            for hook in self._on_finish:
                hook(r)
            self.release(r)
            self._done(r)
        if finished:
            self._run_no_more(finished)
        if sampled:
            self._liveness.stalled = 0
        if step.requests:                            # (the leading decodes are all sampled)
            more = list(compress(batch.req_ids[n:], batch.sample[n:]))
            self._sampled = decoded + more if more else decoded
        else:
            self._sampled = batch.req_ids
        for hook in self._after_step:
            hook(self._sampled, sampled)
        size, kv = len(batch.req_ids), self.kv
        tokens = n + sum(batch.query_lens[n:]) if step.requests else n
        self.step_log.append([start, result.duration, size, prefill_tokens, tokens - prefill_tokens, n_prefill,
                              size - n_prefill, kv.num_blocks - kv.num_free, len(self._waiting), len(self._running),
                              step.preempted, step.rejected])
        self.step_index += 1
        if self.cfg.check_invariants:
            kv.check()
