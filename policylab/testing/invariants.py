"""The engine-wide invariants of DESIGN §8, checked after every step of a replay.

`StepChecker` is fed by the recording proxies of `policylab.testing.harness`: the view and
plan of every schedule() call, the batch of every executed step, and the engine after it.
The engine turns any exception raised inside a step into a partial result, so the first
violation is kept and re-raised after the run. Policy-specific properties are in
`policylab.testing.properties`.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from policylab.core.config import EngineConfig
from policylab.core.contract import StepPlan
from policylab.core.engine import Engine
from policylab.core.extensions.forks import fork_plan
from policylab.core.kv import blocks_for
from policylab.core.result import RunResult
from policylab.core.request import Status
from policylab.testing.prefix_tier_checks import check_prefix_tiers
from policylab.testing.properties import InvariantViolation, build_properties
from policylab.testing.spec_invariants import SpecChecks
from policylab.testing.tool_invariants import ToolCallChecks

EPS = 1e-9


def arrived(engine: Engine) -> list:
    """The requests that have arrived: every one that exists (a request exists from its arrival;
    under a closed-loop client turns arrive as earlier ones finish, in no trace order); forks included."""
    return [r for r in engine.requests if r is not None]


@dataclass(frozen=True)
class Snap:
    """A live request as the policy saw it when asked to schedule."""

    num_tokens: int
    num_computed: int
    num_output: int
    num_cached: int
    is_decode: bool


class StepChecker:
    """The engine-wide invariants of DESIGN §8, checked after every step."""

    def __init__(self, policy, cfg: EngineConfig, trace, max_steps: int, properties: bool = True):
        self.policy, self.cfg, self.max_steps = policy, cfg, max_steps
        self.name = getattr(policy, "name", type(policy).__name__)
        self.properties = build_properties(policy, cfg, trace) if properties else []
        self.violation: InvariantViolation | None = None
        self.status: dict = {}          # req_id -> status after the previous step
        self.next_ctx: dict = {}        # req_id -> where its next chunk must start
        self.chunk_sum: dict = {}       # req_id -> cached + chunk tokens since its (re)start
        self.swapped: dict = {}         # req_id -> (computed tokens, output ids) when swapped out
        self.clock, self.steps = 0.0, 0
        self.tools = ToolCallChecks(self.fail)   # requests paused for tool calls
        self.plan = self.snaps = self.batch = None
        self.spec = SpecChecks(self)    # speculative steps: drafts, their counts and their KV
        self.engine: Engine | None = None     # set by the checked engine (forks' checks read its KV)

    def fail(self, invariant: str, detail: str):
        self.violation = self.violation or InvariantViolation(invariant, detail, self.name)
        raise self.violation

    def _each_property(self, hook: str, *args) -> None:
        for p in self.properties:
            try:
                getattr(p, hook)(*args)
            except InvariantViolation as e:
                self.violation = self.violation or e
                raise

    # ------------------------------------------------------------ observers
    def begin_step(self) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            self.fail("liveness", f"no drain after {self.max_steps} steps (preempt/requeue livelock?)")
        self.plan = self.snaps = self.batch = None

    def before_schedule(self, view) -> None:
        self.snaps = {v.req_id: Snap(v.num_tokens, v.num_computed_tokens, v.num_output_tokens,
                                     v.num_cached_tokens, v.is_decode)
                      for lst in (view.running, view.waiting) for v in lst}
        self.tools.views_hide_paused(view)
        decoding = {v.req_id for v in view.running if v.is_decode}
        full = {rid for rid in decoding if view.by_id[rid].num_computed_tokens % view.block_size == 0}
        if set(view.decoding) != decoding or view.decode_blocks_needed != len(full) + self._decode_copies(decoding) \
                or list(view.decode_tokens()) != [v.req_id for v in view.running if v.req_id in decoding]:
            self.fail("view", f"step {view.step}: the view's decode facts disagree with the requests "
                      f"(decoding {sorted(view.decoding)} vs {sorted(decoding)}, decode blocks "
                      f"{view.decode_blocks_needed} vs {len(full)})")
        self._each_property("before_schedule", view)

    def _decode_copies(self, decoding: set) -> int:
        """Copy-on-writes every decode takes: of W decodes writing a block held R times, min(W, R - 1)."""
        engine = self.engine
        if engine is None or engine.extension("forks") is None:
            return 0
        refs, bs, writers = engine.kv.refs, engine.kv.block_size, Counter()
        for rid in decoding:
            r = engine.requests[rid]
            i = r.num_computed_tokens // bs
            if i < len(r.block_table) and refs[r.block_table[i]] > 1:
                writers[r.block_table[i]] += 1
        return sum(min(w, refs[b] - 1) for b, w in writers.items())

    def check_writes(self, batch) -> None:
        """No block is written while shared: every block a step writes has one reference (prefix-cache
        hits share full blocks that no step writes; forks copy a shared block before writing it)."""
        if self.engine is None:
            return
        refs, bs = self.engine.kv.refs, self.engine.kv.block_size
        for rid, n, ctx, table in zip(batch.req_ids, batch.query_lens, batch.context_lens, batch.block_tables):
            shared = [b for b in table[ctx // bs:blocks_for(ctx + n, bs)] if refs[b] != 1]
            if shared:
                self.fail("no_write_while_shared", f"request {rid} writes tokens {ctx}..{ctx + n - 1} into "
                          f"blocks {shared} held {[refs[b] for b in shared]} times")

    def _new_forks(self, engine: Engine) -> None:
        """A fork starts where its prompt's shared blocks end (its last prompt token is its own)."""
        for r in engine.requests[len(engine.trace):]:
            if r.req_id not in self.status and r.status is Status.RUNNING:
                self.next_ctx[r.req_id] = self.chunk_sum[r.req_id] = r.num_computed_tokens

    def after_schedule(self, view, plan) -> None:
        if not isinstance(plan, StepPlan):
            return                        # the engine reports it as ContractViolation(plan_type)
        self.plan = plan
        if not plan.num_scheduled_tokens and not plan.preempt and not plan.reject:
            room = len(view.running) < view.max_num_seqs
            if self.tools.holding_memory():     # the engine waits for a tool's return (or frees kept KV)
                pass
            elif view.running or any(room and view.blocks_needed(v, 1) <= view.num_free_blocks
                                   for v in view.waiting):
                self.fail("work_conservation", f"step {view.step}: empty plan with {len(view.running)} "
                          f"running, {len(view.waiting)} waiting, {view.num_free_blocks} free blocks")
        self._each_property("after_schedule", view, plan)

    def end_step(self, engine: Engine) -> None:
        now = engine.clock.now
        if now < self.clock - EPS:
            self.fail("causality", f"clock went back from {self.clock} to {now}")
        self.clock = now
        if self.batch is not None:
            self._check_batch(engine)
        if engine.extension("forks") is not None:
            self._new_forks(engine)
        self._check_lifecycle(engine)
        self._check_conservation(engine)
        self._check_kv(engine)
        self._each_property("after_step", engine)

    # --------------------------------------------------------------- checks
    def _check_batch(self, engine: Engine) -> None:
        b, cfg, bs = self.batch, self.cfg, engine.kv.block_size
        drafts = self.spec.check_step(engine, b, self.snaps, self.plan)   # batch row -> (k, tokens gained)
        self.tools.not_scheduled(b, self.snaps)
        if len(b) > cfg.max_num_seqs:
            self.fail("seq_cap", f"{len(b)} requests in a step > max_num_seqs={cfg.max_num_seqs}")
        if b.num_tokens > cfg.max_num_batched_tokens:
            self.fail("token_budget", f"{b.num_tokens} tokens in a step > "
                      f"max_num_batched_tokens={cfg.max_num_batched_tokens}")
        for row, (rid, n, ctx, sample) in enumerate(zip(b.req_ids, b.query_lens, b.context_lens, b.sample)):
            s, start = self.snaps[rid], self.next_ctx.get(rid)
            k, gained = drafts.get(row, (0, 1))
            n -= k                                 # (a verification: its decode token, then k drafts)
            if start is None:                      # (re)start: only prefix-cache hits precede it
                if ctx != s.num_cached or ctx % bs:
                    self.fail("chunks", f"request {rid} starts at token {ctx}, expected its "
                              f"{s.num_cached} cached tokens")
                self.chunk_sum[rid] = ctx
            elif ctx != start:
                self.fail("chunks", f"request {rid}: chunk starts at {ctx}, previous one ended at {start}")
            if ctx + n > s.num_tokens:
                self.fail("chunks", f"request {rid}: chunk ends at {ctx + n} > {s.num_tokens} known tokens")
            if sample != (ctx + n == s.num_tokens):
                self.fail("no_decode_before_prefill", f"request {rid} sampled={sample} after computing "
                          f"{ctx + n} of {s.num_tokens} tokens")
            if s.is_decode:
                if n != 1 or ctx != s.num_tokens - 1:
                    self.fail("no_decode_before_prefill", f"request {rid} decoded {n} tokens at {ctx}")
            else:
                self.chunk_sum[rid] += n
                if sample and self.chunk_sum.pop(rid) != s.num_tokens:
                    self.fail("chunks", f"request {rid}: cached + chunks != {s.num_tokens} tokens")
            n, sample = (gained, gained) if k else (n, sample)
            self.next_ctx[rid] = ctx + n
            r = engine.requests[rid]
            paused = r.status is Status.PAUSED         # (its KV as its tool call chose: checked there)
            if not paused and r.num_computed_tokens != ctx + n or len(r.output_ids) != s.num_output + sample:
                self.fail("chunks", f"request {rid}: engine state disagrees with the batch it ran")

    def _check_lifecycle(self, engine: Engine) -> None:
        plan, batch = self.plan, self.batch
        ran = set(batch.req_ids) if batch is not None else set()
        preempted = set(plan.preempt) if plan is not None else set()
        rejected = set(plan.reject) if plan is not None else set()
        for r in arrived(engine):
            rid, new = r.req_id, r.status
            old = self.status.get(rid)
            self.status[rid] = new
            if new is Status.FINISHED and old is not Status.FINISHED:
                if rid not in ran or len(r.output_ids) != engine.target_len[rid]:
                    self.fail("lifecycle", f"request {rid} finished without running to its output "
                              f"length ({len(r.output_ids)} of {engine.target_len[rid]} tokens)")
            if new is Status.RUNNING and len(r.output_ids) >= engine.target_len[rid]:
                self.fail("lifecycle", f"request {rid} still runs with all its output tokens")
            if new is Status.REJECTED and not r.reject_reason:
                self.fail("lifecycle", f"request {rid} rejected without a reason")
            if old is Status.PAUSED:
                self._check_tool_return(engine, r, new, ran)
                continue
            if new is Status.PAUSED and old is not Status.PAUSED:
                self._check_tool_pause(engine, r, ran)
                continue
            if new is old or old is None and new in (Status.WAITING, Status.REJECTED):
                continue
            ok = {(Status.WAITING, Status.RUNNING): rid in ran,
                  (Status.WAITING, Status.FINISHED): rid in ran,
                  (Status.WAITING, Status.REJECTED): rid in rejected,
                  (Status.RUNNING, Status.WAITING): rid in preempted,
                  (Status.RUNNING, Status.FINISHED): rid in ran,
                  (None, Status.RUNNING): rid in ran or r.fork_of is not None,
                  (None, Status.FINISHED): rid in ran}.get((old, new), False)
            if not ok:
                self.fail("lifecycle", f"request {rid}: illegal transition {old} -> {new.value}")
            if new is Status.WAITING and rid in plan.swap:   # swapped: its KV on the host tier
                self._check_swapped_out(engine, r)
            elif new is Status.WAITING:            # preempted: KV freed, recomputed from scratch
                if r.block_table or r.num_computed_tokens or r.swapped_blocks:
                    self.fail("lifecycle", f"preempted request {rid} kept its KV")
                self.next_ctx.pop(rid, None)
                self.chunk_sum.pop(rid, None)
            if old is Status.WAITING and new is not Status.REJECTED and rid in self.swapped:
                self._check_resumed(r)

    def _check_tool_pause(self, engine: Engine, r, ran: set) -> None:
        """RUNNING -> PAUSED: it ran this step (the token that begins the call); its KV as chosen."""
        if r.req_id not in ran:
            self.fail("lifecycle", f"request {r.req_id} paused for a tool call without running")
        self.tools.paused_now(engine, r)
        self._tool_chunks(r)

    def _tool_chunks(self, r) -> None:
        """Where a paused request's next chunk starts: from the prefix cache if its KV was freed,
        where it stopped otherwise."""
        if self.tools.paused[r.req_id][0] == "free":
            self.next_ctx.pop(r.req_id, None)
            self.chunk_sum.pop(r.req_id, None)
        else:
            self.chunk_sum[r.req_id] = r.num_computed_tokens

    def _check_tool_return(self, engine: Engine, r, new: Status, ran: set) -> None:
        """PAUSED -> waiting or running (kept KV), or on to running, paused again or finished by
        a step it ran in."""
        if new is Status.PAUSED:
            if self.tools.still_paused(engine, r):
                self._tool_chunks(r)
            return
        if new is not Status.WAITING and r.req_id not in ran:
            self.fail("lifecycle", f"request {r.req_id}: illegal transition paused -> {new.value}")
        self.tools.resumed(engine, r)

    def _check_swapped_out(self, engine: Engine, r) -> None:
        """A swap victim holds no device block, keeps its computed tokens, and the host tier holds
        exactly its computed blocks."""
        host, bs = engine.kv.host, engine.kv.block_size
        if r.block_table or not host.holds(r.req_id) or r.swapped_blocks != host.blocks_of(r.req_id) \
                or r.swapped_blocks != -(-r.num_computed_tokens // bs):
            self.fail("swap", f"swapped request {r.req_id}: {len(r.block_table)} device blocks, "
                      f"{host.blocks_of(r.req_id)} host blocks for {r.num_computed_tokens} computed tokens")
        self.swapped[r.req_id] = (r.num_computed_tokens, tuple(r.output_ids))

    def _check_resumed(self, r) -> None:
        """A swapped request resumes with exactly its tokens: the computed ones it left with (its
        next chunk starts there: `next_ctx`) and the same output ids, plus what this step sampled."""
        computed, outputs = self.swapped.pop(r.req_id)
        if r.swapped_blocks or tuple(r.output_ids[:len(outputs)]) != outputs \
                or self.next_ctx.get(r.req_id, computed) < computed:
            self.fail("swap", f"request {r.req_id} resumed from the host tier with other tokens than "
                      f"it left with ({computed} computed, {len(outputs)} outputs)")

    def _check_conservation(self, engine: Engine) -> None:
        live = arrived(engine)
        count = Counter(r.status for r in live)
        done = count[Status.FINISHED] + count[Status.REJECTED]
        ended = (Status.FINISHED, Status.REJECTED)
        groups_done = sum(1 for r in live if r.req_id < len(engine.trace) and r.status in ended
                          and all(f.status in ended for f in r.forks or ()))
        if done + count[Status.WAITING] + count[Status.RUNNING] + count[Status.PAUSED] != len(live) \
                or engine.num_done != groups_done:
            self.fail("request_conservation", f"{len(live)} arrived != {dict(count)}")
        for queue, status in ((engine.waiting, Status.WAITING), (engine.running, Status.RUNNING)):
            if len(queue) != count[status] or any(r.status is not status for r in queue):
                self.fail("request_conservation", f"the {status.value} queue disagrees with request states")
        now = engine.clock.now
        if any(r is not None and r.arrival_time > now + EPS for r in engine.requests[:len(engine.trace)]):
            self.fail("request_conservation", "a request exists before its arrival")

    def _check_kv(self, engine: Engine) -> None:
        kv = engine.kv
        held = Counter(b for r in engine.running for b in r.block_table)
        for rid in self.tools.kept_released(engine):     # restarts from the prefix cache
            self.next_ctx.pop(rid, None)
            self.chunk_sum.pop(rid, None)
        held.update(self.tools.held_by_paused(engine))
        if any(r.block_table for r in engine.waiting if r.req_id not in self.tools.kept_waiting):
            self.fail("kv_conservation", "a waiting request holds KV blocks")
        refs = kv.refs
        wrong = [b for b in range(kv.num_blocks) if refs[b] != held.get(b, 0)]
        if wrong or kv.num_used != len(held) or kv.num_used + kv.num_free != kv.num_blocks:
            self.fail("kv_conservation", f"ref counts disagree with block tables at blocks {wrong[:5]}; "
                      f"used={kv.num_used} held={len(held)} free={kv.num_free} total={kv.num_blocks}")
        self._check_host_tier(engine)
        if engine.kv.tiers is not None:
            check_prefix_tiers(self, engine)

    def _check_host_tier(self, engine: Engine) -> None:
        """Conservation on the host tier: used + free = total, and what it holds is exactly the
        swapped-out waiting requests' blocks."""
        host = engine.kv.host
        held = host.swapped()
        owners = {r.req_id: r.swapped_blocks for r in engine.waiting if r.swapped_blocks}
        owners.update(self.tools.host_owners(engine))
        if host.num_used + host.num_free != host.num_blocks or len(set().union(*held.values())) != host.num_used \
                or {rid: len(b) for rid, b in held.items()} != owners:
            self.fail("kv_conservation", f"host tier: used={host.num_used} free={host.num_free} "
                      f"total={host.num_blocks}; held {dict((k, len(v)) for k, v in held.items())} "
                      f"vs swapped requests {owners}")
        if any(r.swapped_blocks for r in engine.running):
            self.fail("kv_conservation", "a running request still has KV on the host tier")

    # ------------------------------------------------------------ at drain
    def _check_output_length(self, engine: Engine, r) -> None:
        """A finished request generated min(its trace output length, its max_tokens) tokens (fewer
        only when it stopped at EOS): checked against the request and the trace, not against the
        engine's own target."""
        if r.fork_of is None:
            length = engine.trace[r.req_id].output_tokens
        else:                               # sample k of its trace request: the trace's k-th fork length
            t, parent = engine.trace[r.fork_of], engine.requests[r.fork_of]
            length = fork_plan(t, engine.cfg.parallel_samples, engine.cfg.beam_width)[1][parent.forks.index(r)]
        want, n = min(length, r.max_tokens), len(r.token_times)
        eos = engine.cfg.stop_at_eos and r.output_ids and r.output_ids[-1] == engine.dataplane.eos_token_id
        if n > want or (n < want and not eos):
            self.fail("output_length", f"request {r.req_id} generated {n} tokens; max_tokens is {r.max_tokens} "
                      f"and the trace's output length {length}")

    def finish(self, engine: Engine, result: RunResult) -> None:
        if self.violation is not None:
            raise self.violation
        if result.partial:
            kind = "contract" if result.error.startswith("ContractViolation") else "liveness"
            self.fail(kind, f"run ended early: {result.error}")
        kv = engine.kv
        if any(kv.refs) or kv.num_free != kv.num_blocks:
            self.fail("no_leak", f"{kv.num_used} KV blocks still held at drain")
        if engine.kv.host.num_used or engine.kv.host.num_free != engine.kv.host.num_blocks:
            self.fail("no_leak", f"{engine.kv.host.num_used} host-tier KV blocks still held at drain")
        if engine.kv.tiers is not None:
            check_prefix_tiers(self, engine)
        for r in result.requests:
            if r is None or r.status not in (Status.FINISHED, Status.REJECTED):
                self.fail("liveness", f"request {getattr(r, 'req_id', '?')} did not finish")
            times = [r.arrival_time, r.first_scheduled_time, *r.token_times, r.finish_time]
            times = [t for t in times if t is not None]
            repeated = len(set(r.token_times)) != len(r.token_times) - self.spec.shared_times.get(r.req_id, 0)
            if repeated or any(b < a - EPS for a, b in zip(times, times[1:])):
                self.fail("causality", f"request {r.req_id}: arrival, scheduled, tokens, completion "
                          f"out of order: {times}")
            if r.status is Status.FINISHED:
                self._check_output_length(engine, r)
            if r.status is Status.FINISHED and r.forks:     # done with its last sample
                ends = [f.finish_time for f in (r, *r.forks) if f.status is Status.FINISHED]
                if r.finish_time != max(ends) or r.finish_time < r.token_times[-1]:
                    self.fail("causality", f"request {r.req_id} completed at {r.finish_time}, not when its "
                              f"last sample did ({max(ends)})")
            elif r.status is Status.FINISHED and r.token_times[-1] != r.finish_time:
                self.fail("causality", f"request {r.req_id} completed at {r.finish_time}, "
                          "not at its last token")
        starts, durations = result.steps["clock"], result.steps["duration"]
        if any(b < a + d - EPS for a, d, b in zip(starts, durations, starts[1:])):
            self.fail("causality", "a step started before the previous one ended")
        self._each_property("at_end", engine, result)
