"""The replay engine: admit → schedule → validate → commit → execute → postprocess (DESIGN §2).

The engine owns requests, KV blocks and the clock; the policy only plans. Every
request of the trace ends finished or rejected with a reason; a run cut short (a
broken contract, a raising policy, Ctrl-C) returns what it has, marked partial.
"""
from __future__ import annotations

import math
from array import array
from itertools import compress, islice
from types import MappingProxyType
from typing import Callable, Optional

import numpy as np

from policylab.core.admission import never_fits, predict_output
from policylab.core.clock import make_clock
from policylab.core.config import EngineConfig, check_engine_config
from policylab.core.contract import (ContractViolation, DecodeFacts, RequestView, SchedulerView, StepPlan,
                                     check_plan, private_copy)
from policylab.core.batch import CommittedStep, DataPlane, StepResult, bad_duration, joined
from policylab.core.decoding import Decoding
from policylab.core.forks import Forks, uses_forks
from policylab.core.gc_freeze import FrozenHeap
from policylab.core.kv import BlockManager, chain_hashes
from policylab.core.liveness import Liveness
from policylab.core.policy import Policy
from policylab.core.prefix_tiers import make_prefix_tiers
from policylab.core.synthetic_prompts import SyntheticPrompt, synthesize_prompt
from policylab.core.waiting_queue import QueueView, WaitingQueue
from policylab.core.request_steps import commit_requests, postprocess_requests
from policylab.core.request import NO_TOKENS, Request, SamplingParams, Status, TraceRequest, check_arrivals, forget_done
from policylab.core.result import RunResult, mark_partial
from policylab.core.speculative import Speculation
from policylab.core.step_log import StepLog
from policylab.core.swap import Swapper
from policylab.core.tool_calls import ToolCalls, has_tool_calls


class Engine:
    def __init__(self, trace: list, policy: Policy, dataplane: DataPlane, cfg: EngineConfig,
                 seed: int = 0, prefix_block_tokens: int = 512,
                 sampling: SamplingParams = SamplingParams()):
        self.trace = sorted(trace, key=lambda t: t.arrival_time)
        check_arrivals(self.trace)
        self.policy, self.dataplane, self.cfg, self.seed = policy, dataplane, cfg, seed
        self.policy_name = getattr(policy, "name", type(policy).__name__)
        self.prefix_block_tokens, self.sampling = prefix_block_tokens, sampling
        check_engine_config(cfg)
        num_blocks = cfg.num_blocks or dataplane.num_kv_blocks(cfg.block_size)
        self.kv = BlockManager(num_blocks, cfg.block_size, cfg.enable_prefix_caching, cfg.prefix_cache)
        self.swap = Swapper(cfg, dataplane)           # swap preemption (an empty host tier: off)
        self.host, self.kv_stats = self.swap.host, self.swap.stats
        self.kv.tiers = make_prefix_tiers(cfg, dataplane, self.kv_stats)   # host/disk prefix tiers (or None)
        dataplane.allocate_kv(num_blocks, cfg.block_size)
        self.clock = make_clock(cfg.clock)
        self.requests: list = [None] * len(self.trace)
        self.target_len: list = [0] * len(self.trace)   # req_id -> output tokens to generate (hidden)
        self.views: dict = {}            # req_id -> RequestView, live requests only
        self._views_ro = MappingProxyType(self.views)
        self._waiting = WaitingQueue(self.views)       # req_ids; changes cost what changed (§2 admit)
        self._waiting_view = QueueView(self._waiting)  # the policies' live, read-only window on it
        self._running: list = []
        self._running_views = None       # views of running, rebuilt when it changes
        self._running_ids: list = []     # their req_ids, in running order (rebuilt with the views)
        self._decoding = Decoding(self.requests, self.target_len, cfg.block_size)   # and the decode batch
        self.next_arrival = 0
        self._next_arrival_time = self._next_trace_arrival   # when more work can come (None: never)
        self.asleep = False              # a replica whose policy waits: no step until a delivery
        self.arrivals = None             # a closed-loop client (core.closed_loop): arrivals it makes
        self.num_done = 0
        self._forgotten = 0              # requests below this req_id were handed to a writer
        self.step_index = 0
        self.step_log = StepLog()        # one typed row per executed step, in STEP_FIELDS order
        self._rng = np.random.default_rng(seed)
        self._liveness = Liveness(cfg.max_stall_steps, self.policy_name)
        self._on_done = None
        self.before_release: Optional[Callable[[Request], None]] = None   # a finished request, its KV
                                         # still in its blocks (a P/D prefill replica copies it)
        self._eos = dataplane.eos_token_id if cfg.stop_at_eos else None
        # a plane whose engine schedules one step ahead (vLLM's async scheduling): while requests run,
        # an arrival is first seen by the step after the next (admitted up to the last step's start)
        self._schedules_ahead, self._last_step_start = bool(getattr(dataplane, "schedules_ahead", False)), 0.0
        self._sampled, self._arrived = [], []   # since the last schedule(): req_ids given a token, arrived
        self.speculation = Speculation(self)    # steps that verify draft tokens (StepPlan.spec_tokens)
        self.forks = Forks(self, cfg.parallel_samples, cfg.beam_width) \
            if uses_forks(self.trace, cfg.parallel_samples, cfg.beam_width) else None   # parallel samples, beams
        self.tools = ToolCalls(self) if has_tool_calls(self.trace) else None   # requests that pause
        if self.tools is not None:                                              # for tool calls
            self._next_arrival_time = self.tools.next_event

    running = property(lambda self: self._running)
    waiting = property(lambda self: [self.requests[rid] for rid in self._waiting.ids()],
                       doc="The waiting requests in queue order (a new list: for checks and tests).")

    @running.setter
    def running(self, value: list) -> None:
        self._running, self._running_views = value, None
        self._decoding.running_changed()

    def run(self, on_request_done: Optional[Callable[[int], None]] = None) -> RunResult:
        result = self.begin(on_request_done)
        with FrozenHeap() as heap:
            try:
                while self.num_done < len(self.trace):
                    self.step()
                    heap.freeze_if_due(self.num_done)
                self.kv.check()
            except BaseException as e:  # Ctrl-C or a stop signal, a broken contract, a policy or data
                mark_partial(result, e)  # plane that raises (even sys.exit): results so far kept
            result.steps = self.steps
        return result

    # ---------------------------------- stepping API: a driver (policylab.cluster) runs engines
    def begin(self, on_request_done: Optional[Callable[[int], None]] = None) -> RunResult:
        """Start a run that a driver steps (`step()` while work is left); the result it fills."""
        self._on_done = on_request_done
        result = RunResult(self.trace, self.requests, {}, self.kv.num_blocks, self.kv.block_size, self.policy_name)
        if self.host.num_blocks or self.kv.tiers is not None:       # (filled as the run goes)
            result.kv_tiers = self.kv_stats
        result.sessions = getattr(self.arrivals, "plan", None)
        result.speculative = self.speculation.stats
        if self.forks is not None:     # parallel samples: their counters
            result.forks = self.forks.stats
        if self.tools is not None:
            result.programs = self.tools
        return result

    def take_arrivals_from(self, next_event_time: Callable[[], Optional[float]]) -> None:
        """Make this engine a replica: requests come only through `deliver`/`receive_prefilled`. When
        its policy waits, `next_event_time()` is when more can come: a time (it idles until then),
        math.inf (it sleeps until a delivery wakes it) or None (never: work conservation broken)."""
        if self.tools is not None:
            raise ValueError("tool calls are not supported on a cluster yet: replay the trace on one engine")
        self.next_arrival = len(self.trace)
        self._next_arrival_time = next_event_time

    def deliver(self, i: int) -> None:
        """Request i of the trace arrives now: a router chose this replica for it."""
        self.clock.idle_until(self.trace[i].arrival_time)
        self.asleep = False
        self._arrive(i)

    def refuse(self, i: int, reason: str) -> None:
        """Request i of the trace never reaches the queue (its session ended): rejected now."""
        t = self.trace[i]
        self.clock.idle_until(t.arrival_time)
        self.requests[i] = r = Request(i, t.arrival_time, NO_TOKENS, t.max_tokens or 1, t.client, t.priority)
        self._reject(r, reason)

    def receive_prefilled(self, r: Request, target_len: int) -> None:
        """A request prefilled elsewhere joins the waiting queue with its prompt's KV in
        `r.block_table` (blocks of this cache, taken when its transfer began): it decodes here."""
        self.requests[r.req_id], self.target_len[r.req_id] = r, target_len
        self.views[r.req_id] = RequestView(r, self.kv)
        self._waiting.append(r.req_id)
        self._arrived.append(r.req_id)
        self.asleep = False

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

    def step(self) -> None:
        self.clock.start_step()
        self._admit()
        try:
            committed = self._schedule()
        except ContractViolation as e:     # say where: the step and the replay time it was planned at
            e.locate(self.step_index, self.clock.now)
            raise
        if committed is not None:
            result = self.dataplane.execute(committed.batch)
            if not 0.0 <= result.duration < math.inf:     # (NaN fails too) a NaN clock would hang
                raise bad_duration(self.dataplane, committed.batch, result.duration)   # the replay forever
            if self.swap.moved_blocks:
                result = self.swap.with_transfer(result)
            if self.kv.tiers is not None and self.kv.tiers.moved:
                result = self.kv.tiers.with_transfer(result)
            self._postprocess(committed, result)

    # ------------------------------------------------------------- admit
    def _admit(self) -> None:
        if self.arrivals is not None:      # closed loop: the client's due turns arrive
            return self.arrivals.admit(self)
        now = self.clock.now
        seen = self._last_step_start if self._schedules_ahead and self._running else now
        while self.next_arrival < len(self.trace) and self.trace[self.next_arrival].arrival_time <= seen:
            self._arrive(self.next_arrival)
            self.next_arrival += 1
        if self.tools is not None:
            self.tools.resume_due(now)

    def _arrive(self, i: int) -> None:
        t: TraceRequest = self.trace[i]
        cfg = self.cfg
        reason = never_fits(t.prompt_tokens, t.output_tokens, cfg.max_model_len, self.kv.num_blocks,
                            self.kv.block_size, t.max_tokens or cfg.max_tokens)   # by arithmetic: no token or hash
        if self.tools is not None and not reason:
            reason = self.tools.never_fits(t, cfg, self.kv)
        if reason:                       # is built for a request that can never run, however long its prompt
            ids = NO_TOKENS
        elif t.prompt_ids is not None:
            ids = np.asarray(t.prompt_ids, dtype=np.int32)
        else:                            # (ids made again when read, not held, if the plane reads none)
            ids = (synthesize_prompt if self.dataplane.needs_token_ids else SyntheticPrompt)(
                i, t.prompt_tokens, t.prefix_hashes, self.dataplane.vocab_size, self.seed, self.prefix_block_tokens)
        max_tokens = t.max_tokens or cfg.max_tokens or max(cfg.max_model_len - t.prompt_tokens, 1)
        r = Request(i, t.arrival_time, ids, max_tokens, t.client, t.priority, t.ttft_slo,
                    t.tpot_slo, predict_output(cfg, self._rng, t.output_tokens), self.sampling)
        self.requests[i] = r
        self.target_len[i] = min(t.output_tokens, max_tokens)
        if self.tools is not None:
            self.tools.arrived(i)
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
            self._release(r)
        if r.swapped_blocks:       # waiting with its KV on the host tier
            self.swap.drop(r)
        r.status, r.reject_reason, r.finish_time = Status.REJECTED, reason, self.clock.now
        self._done(r)

    def _done(self, r: Request) -> None:
        view = self.views.pop(r.req_id, None)
        if self.forks is not None and (r := self.forks.group_done(r)) is None:   # samples still run
            return self.policy.on_finished(view) if view is not None else None
        self.num_done += 1
        if view is not None:
            self.policy.on_finished(view)
        if self.arrivals is not None:      # closed loop: what follows this request is scheduled
            self.arrivals.finished(r.req_id)
        if self._on_done:
            self._on_done(r.req_id)

    # ---------------------------------------------------------- schedule
    def _view(self) -> SchedulerView:
        kv = self.kv
        if self._running_views is None:
            self._running_ids = ids = [r.req_id for r in self._running]
            self._running_views = tuple(map(self.views.__getitem__, ids))
        return SchedulerView(self.clock.now, self.step_index, self._waiting_view, self._running_views,
                             self._decoding.ids, self.cfg.max_num_batched_tokens, self.cfg.max_num_seqs,
                             kv.block_size, kv.num_free, kv.num_blocks, self._views_ro, self._sampled,
                             self._arrived, self._decode_facts(), self.host.num_blocks and self.host.num_free,
                             self.host.num_blocks)

    def _decode_facts(self) -> DecodeFacts:
        facts = self._decoding.facts or self._decoding.make_facts(self._running_ids)
        if self.forks is not None:       # copy-on-writes of the decodes (their shares change every step)
            facts.cow = self.kv.cow.copies([(self.requests[i], 1) for i in facts.ids])
        return facts

    def _schedule(self) -> Optional[CommittedStep]:
        """Ask the policy, validate its plan, commit it: the step to execute (None: nothing runs)."""
        if not self._running and not self._waiting:
            self._idle_until_next_arrival()
            return None
        view = self._view()
        plan = private_copy(self.policy.schedule(view), self.policy_name)   # read once: what is
        self._sampled, self._arrived = (), []      # told once                  checked is what runs
        leading = check_plan(view, plan, self.policy_name)     # the view's decodes, first
        if not plan.num_scheduled_tokens and not plan.preempt and not plan.reject:
            stuck = self._running or self._next_arrival_time() is None
            if stuck and self.tools is not None and self.tools.unstick():
                return None                 # kept KV freed, or a tool's return awaited: ask again
            if stuck:
                raise ContractViolation(self.policy_name, "work_conservation",
                                        "empty plan while requests wait and nothing else can arrive "
                                        "or run; the replay would never end")
            self._idle_until_next_arrival()
            return None
        return self._commit(plan, leading)

    def _idle_until_next_arrival(self) -> None:
        t = self._next_arrival_time()
        self.asleep = t == math.inf
        if t is not None and not self.asleep:
            self.clock.idle_until(t)

    def _next_trace_arrival(self) -> Optional[float]:
        return self.trace[self.next_arrival].arrival_time if self.next_arrival < len(self.trace) else None

    # ------------------------------------------------------------ commit
    def _commit(self, plan: StepPlan, leading: int = 0) -> Optional[CommittedStep]:
        """Commit a valid plan: without preemptions or rejections its running decodes lead the batch
        on the persistent decode batch (`leading`: the plan's first entries are every decode, in
        running order, as `check_plan` found); every other entry goes one by one (and every entry of
        a plan with draft tokens)."""
        sched = plan.num_scheduled_tokens
        spec = plan.spec_tokens and self.speculation.planned(plan.spec_tokens)
        if leading and not spec:
            decodes = self._decoding.facts.ids       # every decode, in running order
            chunks = dict(islice(sched.items(), leading, None)) if leading < len(sched) else {}
            parts = self._commit_requests(chunks, [], {}) if chunks else None
        else:
            decodes, chunks = ([], sched) if spec else self._decoding.split(plan)
            parts = self._commit_requests(self.speculation.widened(chunks, spec) if spec else chunks, plan.preempt,
                                          plan.reject, plan.swap) if chunks or plan.preempt or plan.reject else None
            if spec:
                self.speculation.commit(parts[0], parts[1], spec)
        if self.forks is not None:       # a shared block is copied before the step writes it
            self.forks.copy_on_write(sched)
        if not decodes:
            if parts is None or not parts[1]:
                return None
            return CommittedStep(parts[0], 0, parts[1], len(plan.preempt), len(plan.reject))
        db = self._decoding.commit(decodes, self.kv, bool(leading))
        if self.dataplane.needs_token_ids:
            db.token_ids = [np.array(r.output_ids[-1:], np.int32) for r in self._decoding.batch_requests]
        if parts is None:
            return CommittedStep(db, len(decodes), [], 0, 0)
        return CommittedStep(joined(db, parts[0]), len(decodes), parts[1], 0, 0)

    _commit_requests = commit_requests           # the entries that go one by one (core.request_steps)
    _postprocess_requests = postprocess_requests

    def _release(self, r: Request) -> None:
        """Free the request's KV (its computed blocks published first): it leaves the decoding sets."""
        self.kv.release_request(r, self.seed, r.own_prompt and r.status is Status.FINISHED)
        self._decoding.discard(r.req_id)

    # ------------------------------------------------------- postprocess
    def _postprocess(self, step: CommittedStep, result: StepResult) -> None:
        start = self._last_step_start = self.clock.now
        self.clock.advance(result.duration)
        batch, n, now, sampled = step.batch, step.decodes, self.clock.now, result.sampled
        finished = self._decoding.postprocess(sampled[:n] if step.requests else sampled, now, self._eos) \
            if n else []
        prefill_tokens = n_prefill = 0
        if step.requests:
            query_lens, rest = (batch.query_lens[n:], sampled[n:]) if batch.spec_lens is None else \
                self.speculation.postprocess(step.requests, batch, result, now)   # drafts accepted, KV trimmed
            more, prefill_tokens, n_prefill = self._postprocess_requests(step.requests, query_lens,
                                                                         batch.sample[n:], rest)
            finished += more
            if self.forks is not None:   # parallel samples fork once the prompt has its first token
                self.running = self._running + self.forks.spawn(step.requests, now)
        if self.tools is not None and finished:       # those at a tool call pause instead
            finished = self.tools.pause_at_calls(finished, now)
        for r in finished:
            r.status, r.finish_time = Status.FINISHED, now
            if self.before_release is not None:
                self.before_release(r)
            self._release(r)
            self._done(r)
        if finished:                    # a copy without them (identity search at C level)
            running = list(self._running)
            for r in finished:
                running.remove(r)
            self.running = running
        if sampled:
            self._liveness.stalled = 0
        self._sampled = list(compress(batch.req_ids, batch.sample)) if step.requests else batch.req_ids
        if self.forks is not None:       # beam search compares its beams once their tokens are in
            self.forks.after_step(self._sampled, sampled)
        size = len(batch.req_ids)
        tokens = n + sum(batch.query_lens[n:]) if step.requests else n
        self.step_log.append([start, result.duration, size, prefill_tokens, tokens - prefill_tokens, n_prefill,
                              size - n_prefill, self.kv.num_used, len(self._waiting), len(self._running),
                              step.preempted, step.rejected])
        self.step_index += 1
        if self.cfg.check_invariants:
            self.kv.check()
