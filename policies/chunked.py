"""chunked — Sarathi-Serve stall-free batching (DESIGN §7).

Rule: one token budget per step, `chunk_size` (default 512; also capped by the engine's
max_num_batched_tokens). First every running decode gets its token (stall-free), then
running partial prefills get chunks, then new requests from `waiting` in queue order
(FCFS, head-of-line: stop at the first that does not fit). On KV shortage the request at
the tail of running (latest started, not yet scheduled this step) is preempted and
recomputed later; a step that preempts admits nothing new (as vLLM v1). Admission stops
at max_num_seqs running requests or when the budget is spent.

`preempt_mode=swap` (vLLM's `preemption_mode="swap"`) swaps a victim's KV out to the host tier
(engine.host_kv_blocks) instead, when it fits there, and recomputes it otherwise; a swapped
request waits at the head of the queue and is swapped back in when admitted again.

`max_partial_prefills` is vLLM's `max_num_partial_prefills` (default 1): at most that many
requests may hold a started, unfinished prefill after a step. With k > 1 each prefill gets
at most budget // min(k, prefill candidates) tokens (vLLM v0's partial-prefill budget
split), so k long prompts advance side by side instead of one hogging the budget.
Sources: Agrawal et al., "Taming Throughput-Latency Tradeoff in LLM Inference with
Sarathi-Serve", OSDI'24 §4.2-4.3; vLLM v1 `Scheduler.schedule` (running first, then
waiting, preempt `running.pop()`); vLLM v0 `PartialPrefillMetadata`.

Subclasses change only the order (`running_order`, `admission_order`) and may reject
(`rejections`), cap prefill tokens (`prefill_cap`), size new chunks (`new_chunk`) or
account for admissions (`on_admitted`).
When every running decode fits the free KV (the usual step), all of them get their token
whatever the order (`view.decode_tokens()`), and only the prefills are ordered; the full
running order matters only when KV runs short and victims must be chosen.
"""
from __future__ import annotations

from typing import Iterable

from policylab import Policy, RequestView, SchedulerView, StepPlan


class _Step:
    """Mutable bookkeeping of one schedule() call."""

    __slots__ = ("view", "plan", "host_free", "budget", "free", "slot", "pending", "taken", "seqs", "partials",
                 "admitted")

    def __init__(self, view: SchedulerView, budget: int, slot: int, pending: list, seqs: int, partials: int,
                 swap: bool = False):
        self.view, self.plan = view, StepPlan()
        self.host_free = view.num_free_host_blocks if swap else 0   # 0: every victim recomputes
        self.budget, self.free, self.slot = budget, view.num_free_blocks, slot
        self.pending = pending            # running, in running order, not yet served: victims from the tail
        self.taken: set = set()           # req_ids of `pending` scheduled or preempted this step
        self.seqs = seqs
        self.partials = partials          # started, unfinished prefills
        self.admitted = 0

    def add(self, v: RequestView, n: int, need: int) -> None:
        self.plan.num_scheduled_tokens[v.req_id] = n
        self.taken.add(v.req_id)
        self.budget -= n
        self.free -= need

    def victim(self) -> RequestView | None:
        while self.pending and self.pending[-1].req_id in self.taken:
            self.pending.pop()
        return self.pending[-1] if self.pending else None

    def preempt(self, v: RequestView) -> None:
        self.plan.preempt.append(v.req_id)
        if self.host_free:
            need = self.view.host_blocks_needed(v)
            if need <= self.host_free:
                self.plan.swap.append(v.req_id)
                self.host_free -= need
        self.taken.add(v.req_id)
        self.free += self.view.blocks_freed_by_preempting(v)
        self.seqs -= 1
        self.partials -= v.is_prefill


def fit_tokens(view: SchedulerView, v: RequestView, n: int, free: int) -> int:
    """Largest m <= n whose KV blocks fit in `free` (blocks_needed grows with m)."""
    if view.blocks_needed(v, n) <= free:
        return n
    lo, hi = 0, n                          # invariant: lo fits, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if view.blocks_needed(v, mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo


class Chunked(Policy):
    properties = ("stall_free", "chunk_budget")

    def __init__(self, name: str | None = None, chunk_size: int | None = 512,
                 max_partial_prefills: int = 1, preempt_mode: str = "recompute"):
        super().__init__(name or "chunked")
        if preempt_mode not in ("recompute", "swap"):
            raise ValueError(f"{self.name}: preempt_mode must be 'recompute' or 'swap', got {preempt_mode!r}")
        self.preempt_mode = preempt_mode
        self.features = ("swap",) if preempt_mode == "swap" else ()
        if chunk_size is not None and (type(chunk_size) is not int or chunk_size < 1):
            raise ValueError(f"{self.name}: chunk_size must be a positive int or null, got {chunk_size!r}")
        if type(max_partial_prefills) is not int or max_partial_prefills < 1:
            raise ValueError(f"{self.name}: max_partial_prefills must be an int >= 1, "
                             f"got {max_partial_prefills!r}")
        self.chunk_size, self.max_partial_prefills = chunk_size, max_partial_prefills

    # ------------------------------------------------------------------ hooks
    def running_order(self, view: SchedulerView, running: list) -> list:
        """`running` (running requests, in start order) in the order they are served;
        preemption victims come from the tail of the whole running order."""
        return running

    def admission_order(self, view: SchedulerView) -> Iterable[RequestView]:
        """Waiting requests in the order they are admitted (may react to `on_admitted`)."""
        return view.waiting

    def rejections(self, view: SchedulerView) -> dict:
        """Waiting req_id -> reason, for admission control."""
        return {}

    def prefill_cap(self, view: SchedulerView, budget: int) -> int:
        """Tokens left for prefill chunks once the running decodes (`view.decoding`) are served."""
        return budget

    def new_chunk(self, view: SchedulerView, v: RequestView, budget: int, admitted: int) -> int:
        """Tokens a newly admitted request gets (0: stop admitting)."""
        return min(v.remaining_tokens, budget)

    def on_admitted(self, v: RequestView, n: int) -> None:
        """A waiting request was given `n` tokens this step."""

    # ---------------------------------------------------------------- schedule
    def token_budget(self, view: SchedulerView) -> int:
        cap = view.max_num_batched_tokens
        return cap if self.chunk_size is None else min(self.chunk_size, cap)

    def schedule(self, view: SchedulerView) -> StepPlan:
        budget = self.token_budget(view)
        prefills, waiting = list(view.prefilling), len(view.waiting)
        sharing = min(self.max_partial_prefills, len(prefills) + waiting)
        slot = max(1, budget // max(1, sharing))        # each prefill's share of the budget
        decode_blocks = view.decode_blocks_needed
        if decode_blocks <= view.num_free_blocks:     # every decode fits: no victim
            s = _Step(view, budget, slot, self.running_order(view, prefills), len(view.running), len(prefills),
                      self.preempt_mode == "swap")
            self._all_decodes(s, decode_blocks)
        else:
            running = self.running_order(view, list(view.running))
            s = _Step(view, budget, slot, running, len(running), len(prefills), self.preempt_mode == "swap")
            decoding = view.decoding
            self._decodes(s, [v for v in running if v.req_id in decoding])
        s.plan.reject = self.rejections(view)
        if not prefills and (s.plan.preempt or waiting == len(s.plan.reject)):
            return s.plan                 # nothing to prefill or admit
        s.budget = min(s.budget, self.prefill_cap(view, s.budget))
        self._running_prefills(s, s.pending[:])
        if not s.plan.preempt:
            self._admit(s, view.max_num_seqs)
        return s.plan

    def _all_decodes(self, s: _Step, blocks: int) -> None:
        """Every running decode gets its token (taking `blocks` free blocks): the decodes lead the plan
        in running order and the prefills follow."""
        view = s.view
        s.plan.num_scheduled_tokens = view.decode_tokens()
        s.budget -= len(view.decoding)
        s.free -= blocks

    def _decodes(self, s: _Step, decodes: list) -> None:
        """KV runs short: serve decodes in running order, preempting from the tail."""
        taken, tokens, needed = s.taken, s.plan.num_scheduled_tokens, s.view.blocks_needed
        for v in decodes:                 # one token each, inline bookkeeping
            rid = v.req_id
            if rid in taken:
                continue
            need = needed(v, 1)
            if need > s.free:
                while need > s.free and s.victim() is not v:
                    s.preempt(s.victim())
                if need > s.free:         # v is the tail: everything after it is preempted already
                    s.preempt(v)
                    return
            tokens[rid] = 1
            taken.add(rid)
            s.budget -= 1
            s.free -= need

    def _running_prefills(self, s: _Step, prefills: list) -> None:
        needed = s.view.blocks_needed
        for v in prefills:
            if v.req_id in s.taken:
                continue
            left = v.remaining_tokens      # (the view stays as it is while the plan is made)
            n = min(left, s.budget, s.slot)
            if n < 1:
                return
            need = needed(v, n)            # (the chunk fits whole: fit_tokens' first question)
            m = n if need <= s.free else fit_tokens(s.view, v, n, s.free)
            while m == 0 and s.victim() is not v:
                s.preempt(s.victim())
                m = fit_tokens(s.view, v, n, s.free)
            if m:                          # else it keeps its KV and waits a step
                s.partials -= m == left
                s.add(v, m, need if m == n else needed(v, m))

    def _admit(self, s: _Step, seq_cap: int) -> None:
        if s.seqs >= seq_cap or s.budget < 1:    # (no order asked for when nobody can be admitted)
            return
        view = s.view
        for v in self.admission_order(view):
            if v.req_id in s.plan.reject:
                continue
            if s.seqs >= seq_cap or s.budget < 1:
                return
            n = self.new_chunk(view, v, min(s.budget, s.slot), s.admitted)
            partial = n < v.remaining_tokens      # its prefill goes on after this step
            if n < 1 or (partial and s.partials >= self.max_partial_prefills):
                return
            need = view.blocks_needed(v, n)
            if need > s.free:
                return
            s.partials += partial
            s.add(v, n, need)
            s.seqs += 1
            s.admitted += 1
            self.on_admitted(v, n)
