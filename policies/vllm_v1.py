"""vllm_v1 — vLLM v1's default scheduler, rule for rule (pinned to vLLM 0.32.0, DESIGN §7).

Checked step by step against vLLM 0.32.0's own `Scheduler` by `policylab.testing.vllm_conformance`
(tests/test_vllm_conformance.py): same per-step `num_scheduled_tokens`, preemptions and finishes.
File names below are under `vllm/v1/core/`; a newer vLLM may move a rule, so re-run the
conformance check before trusting this policy against another version.

One token budget per step (`max_num_batched_tokens`), no phases:
1. Running requests first, in running order (`sched/scheduler.py`, `Scheduler.schedule`, "First,
   schedule the RUNNING requests"), while budget is left: each asks for
   min(remaining tokens, `long_prefill_token_threshold` if set, budget left). The chunk is
   never shrunk to the free KV: when `kv_cache_manager.py` `KVCacheManager.allocate_slots`
   fails, the victim is preempted (`Scheduler._preempt_request`: KV freed, computed tokens
   lost) and the allocation retried, until it fits or the request preempted itself, which
   ends the running pass. Victim: `running[-1]` under `policy: fcfs`, the largest
   (priority, arrival_time) under `policy: priority` (a victim already scheduled this step
   gives its tokens back). Among equal keys `max` takes the first in running order, the oldest:
   under `policy: priority` requests of equal priority and arrival preempt themselves.
2. `long_prefill_token_threshold` applies only when more than one request is running or
   waiting (`Scheduler.schedule`, `num_eligible_reqs > 1`).
3. Block arithmetic: ceil((computed + n) / block_size) minus the blocks held, no lookahead;
   prefix-cache hits that sit free in the LRU cost a free block each
   (`single_type_kv_cache_manager.py`, `SingleTypeKVCacheManager.get_num_blocks_to_allocate`).
   This is `SchedulerView.blocks_needed`.
4. Then, only in a step that preempted nothing ("Next, schedule the WAITING requests"), waiting
   requests in queue order while budget is left and fewer than `max_num_seqs` run (running
   requests not scheduled this step count): FCFS with preempted requests in front, latest
   preemption first (`sched/request_queue.py`, `FCFSRequestQueue.prepend_request`), or, under
   `policy: priority`, by (priority, arrival_time, request id) (`PriorityRequestQueue`,
   `Request.__lt__` in `v1/request.py`). Head of line: the first that cannot be scheduled
   stops admission.
5. A waiting request asks for its whole remainder (prompt plus any output, for a preempted
   one) less its prefix-cache hit; with `enable_chunked_prefill: false` a remainder larger
   than the budget left stops admission, else it is cut to the budget (and to the threshold).
6. `scheduler_reserve_full_isl` (default true): a waiting request is admitted only if its whole
   remainder's blocks fit the free KV, not just the first chunk (`allocate_slots`,
   `full_sequence_must_fit`).
7. `watermark` (vLLM default 0): a waiting request must leave int(watermark * total blocks) blocks
   free, once any request is running (`allocate_slots`, `watermark_blocks`, `has_scheduled_reqs`).
   vLLM's total counts its null block (block 0): a vLLM cache of N + 1 blocks is policylab's N, so
   the total here is num_total_blocks + 1.
8. Prefix caching (`engine.enable_prefix_caching`) is counted as vLLM counts it: the longest
   block-aligned cached prefix, capped at num_tokens - 1 so the last prompt token is always
   recomputed (`kv_cache_manager.py`, `KVCacheManager.get_computed_blocks`); the view's
   `remaining_tokens` and `cached_blocks` give exactly that. vLLM caches a prompt's full blocks as
   soon as it schedules them (`allocate_slots` caches up to the tokens just scheduled), so a
   request admitted later in the same step hits a prefix still being computed: this policy turns
   on `engine.publish_on_schedule` and asks `view.remaining_tokens_after(plan, v)`.
9. Preempted requests go back to the front of waiting in the order vLLM leaves them (the last
   one preempted first), so the plan lists them last-preempted first.
10. The running order is vLLM's `Scheduler.running` list: admitted requests appended in the order
   they were admitted (under priority, priority order), victims removed. The engine's own
   `view.running` appends admissions in waiting-queue order, so the policy keeps vLLM's order
   itself (`_running_ids`).

Cost: a step looks at the prefilling requests only. Between two of them in running order each
decode asks for one token and takes a free block only if its last block is full
(`view.decode_needs_block`), so a run of decodes is served at once, and the order of rule 10 is
rebuilt only when the running requests change. A step in which some request needs a victim goes
request by request (`_schedule_running`: the rules above, verbatim); both give the same plans.

`max_num_partial_prefills` / `max_long_partial_prefills` are vLLM v0's knobs of these names;
vLLM 0.32's v1 scheduler has neither (no limit). Left at null they change nothing; set, they cap
admissions that leave a prompt unfinished: at most `max_num_partial_prefills` unfinished prefills
after the step, at most `max_long_partial_prefills` of them with a remainder longer than
`long_prefill_token_threshold` (v0 `PartialPrefillMetadata`; a long one over the cap is passed
over, not waited for). That extension is not checked against vLLM.

Not modelled (absent from policylab's engine): speculative decoding, KV connectors, encoder
inputs, LoRA, async scheduling, pipeline parallelism, max_model_len clipping (the engine rejects
requests longer than max_model_len on arrival).
"""
from __future__ import annotations

from operator import itemgetter

from policylab import Policy, RequestView, SchedulerView, StepPlan


class VllmV1(Policy):
    engine_defaults = {"length_limit": "stop",    # vLLM runs a prompt shorter than max_model_len, stopping it there,
                       "publish_on_schedule": True}   # and caches a prompt block as soon as it schedules it
    properties = ()         # not stall-free: a long prefill ahead in running order can take the budget

    def __init__(self, name: str | None = None, enable_chunked_prefill: bool = True,
                 long_prefill_token_threshold: int = 0, scheduler_reserve_full_isl: bool = True,
                 policy: str = "fcfs", watermark: float = 0.0,
                 max_num_partial_prefills: int | None = None, max_long_partial_prefills: int | None = None):
        super().__init__(name or "vllm_v1")
        for knob, value in (("enable_chunked_prefill", enable_chunked_prefill),
                            ("scheduler_reserve_full_isl", scheduler_reserve_full_isl)):
            if not isinstance(value, bool):
                raise ValueError(f"{self.name}: {knob} must be true or false, got {value!r}")
        if type(long_prefill_token_threshold) is not int or long_prefill_token_threshold < 0:
            raise ValueError(f"{self.name}: long_prefill_token_threshold must be an int >= 0 (0: off), "
                             f"got {long_prefill_token_threshold!r}")
        if policy not in ("fcfs", "priority"):
            raise ValueError(f"{self.name}: policy must be 'fcfs' or 'priority', got {policy!r}")
        if not isinstance(watermark, (int, float)) or isinstance(watermark, bool) or not 0 <= watermark < 1:
            raise ValueError(f"{self.name}: watermark must be a number in [0, 1), got {watermark!r}")
        for knob, value in (("max_num_partial_prefills", max_num_partial_prefills),
                            ("max_long_partial_prefills", max_long_partial_prefills)):
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"{self.name}: {knob} must be an int >= 1 or null, got {value!r}")
        self.enable_chunked_prefill = enable_chunked_prefill
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.scheduler_reserve_full_isl = scheduler_reserve_full_isl
        self.priority = policy == "priority"
        self.watermark = watermark
        self.max_num_partial_prefills = max_num_partial_prefills
        self.max_long_partial_prefills = max_long_partial_prefills
        self._order: list = []             # req_ids of running requests, in vLLM's running order
        self._order_of = None              # the view's running tuple `_order` was made for
        self._bulk_decodes = None          # (the last plan's tokens, its decodes) when served in bulk
        self._same_order = (None, False)   # (a view's running tuple, whether vLLM's order is the view's)

    # ------------------------------------------------------------------ schedule
    def schedule(self, view: SchedulerView) -> StepPlan:
        plan = StepPlan()
        order = self._running_ids(view)
        threshold = self.long_prefill_token_threshold if len(order) + len(view.waiting) > 1 else 0
        bulk = self._schedule_running_in_bulk(view, order, threshold)
        if bulk is None:                 # a chunk needs a victim: request by request
            running = [view.by_id[rid] for rid in order]
            budget, free = self._schedule_running(view, plan, running, threshold)
            self._order = [v.req_id for v in running]
            self._bulk_decodes = None
        else:
            plan.num_scheduled_tokens, budget, free, decodes = bulk
            self._bulk_decodes = (plan.num_scheduled_tokens, decodes)
        if not plan.preempt:
            self._schedule_waiting(view, plan, threshold, budget, free)
        self._order_of = view.running if len(self._order) == len(view.running) else None
        return plan

    def _running_ids(self, view: SchedulerView) -> list:
        """Rule 10: the running requests' ids in vLLM's order (those that left dropped, those the
        policy did not start appended in the view's order). `_order_of` is the view's running
        tuple the order was last made for: the same tuple, the same requests."""
        running = view.running
        if running is self._order_of:
            return self._order
        live = set(view.decoding).union([v.req_id for v in view.prefilling])   # every running id
        order = self._order
        if len(order) != len(running) or not live.issuperset(order):
            order = [rid for rid in order if rid in live]
            if len(order) < len(running):
                known = set(order)
                order += [rid for rid in (v.req_id for v in running) if rid not in known]
            self._order = order
        return order

    def _schedule_running_in_bulk(self, view: SchedulerView, order: list, threshold: int) -> tuple | None:
        """Rule 1 when no chunk needs a victim, looking at the prefilling requests only: each
        decode asks for one token (its remainder; the threshold and a positive budget leave it
        1) and takes one free block if it is in `view.decode_needs_block`, none otherwise, so a
        run of decodes between two prefills in running order is served at once. Returns
        (tokens, budget left, free blocks left, decodes served), or None where
        `_schedule_running` would preempt (a run of decodes or a chunk that does not fit what is
        free)."""
        tokens: dict = {}
        budget, free = view.max_num_batched_tokens, view.num_free_blocks
        if budget <= 0:
            return tokens, budget, free, 0
        decoding, needs, prefilling = view.decoding, view.decode_needs_block, view.prefilling
        if not prefilling:
            if len(order) <= budget:     # every running request decodes and gets its token
                if len(needs) > free:
                    return None
                return self._every_decode(view, order), budget - len(order), free - len(needs), len(order)
            stops = [(len(order), None)]
        else:
            at = order.index if len(prefilling) <= 8 else dict(zip(order, range(len(order)))).__getitem__
            stops = sorted([(at(v.req_id), v) for v in prefilling], key=itemgetter(0))
            stops.append((len(order), None))
        start = given = 0                # given: decodes served
        for stop, v in stops:
            if stop > start:             # decodes order[start:stop], or as many as the budget takes
                end = min(stop, start + budget)
                decodes = order if end - start == len(order) else order[start:end]
                need = len(needs) if end - start == len(decoding) else sum(map(needs.__contains__, decodes))
                if need > free:
                    return None
                if tokens:
                    tokens.update(dict.fromkeys(decodes, 1))
                else:
                    tokens = dict.fromkeys(decodes, 1)
                budget -= end - start
                free -= need
                given += end - start
                if budget <= 0:
                    return tokens, budget, free, given
            if v is None:
                break
            n = v.remaining_tokens       # a prefill: as `_schedule_running` asks
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget)
            need = view.blocks_needed(v, n)
            if need > free:
                return None
            tokens[v.req_id] = n
            budget -= n
            free -= need
            if budget <= 0:
                return tokens, budget, free, given
            start = stop + 1
        return tokens, budget, free, given

    def _every_decode(self, view: SchedulerView, order: list) -> dict:
        """{req_id: 1} over `order`, every running request (all decoding): the view's own
        `decode_tokens()` where vLLM's order is the view's running order (compared once per change
        of the running requests)."""
        if self._same_order[0] is not view.running:
            self._same_order = (view.running, list(view.decode_tokens()) == order)
        return view.decode_tokens() if self._same_order[1] else dict.fromkeys(order, 1)

    def planned_decodes(self, view: SchedulerView, plan: StepPlan) -> int:
        """Entries of `plan` that give a decoding request its one token: counted as it was built
        when this policy's last plan served its decodes in bulk (the waiting requests it admitted
        are not decoding), one by one otherwise."""
        if self._bulk_decodes is not None and plan.num_scheduled_tokens is self._bulk_decodes[0]:
            return self._bulk_decodes[1]
        decoding = view.decoding
        return sum(1 for rid, n in plan.num_scheduled_tokens.items() if n == 1 and rid in decoding)

    def _schedule_running(self, view: SchedulerView, plan: StepPlan, running: list, threshold: int) -> tuple:
        """Rule 1: running requests in order, preempting victims until each chunk fits.
        `running` loses its victims; returns (budget left, free blocks left)."""
        tokens, preempted = plan.num_scheduled_tokens, []
        budget, free = view.max_num_batched_tokens, view.num_free_blocks
        i = 0
        while i < len(running) and budget > 0:
            v = running[i]
            n = v.remaining_tokens
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget)
            need = view.blocks_needed(v, n)
            while need > free:
                victim = self._victim(running)
                k = running.index(victim)
                del running[k]
                if k < i:
                    i -= 1
                budget += tokens.pop(victim.req_id, 0)
                preempted.append(victim.req_id)
                plan.preempt = preempted[::-1]          # rule 9: vLLM's waiting order
                free = self._free_after(view, plan)
                if victim is v:
                    return budget, free
            tokens[v.req_id] = n
            budget -= n
            free -= need
            i += 1
        return budget, free

    def _victim(self, running: list) -> RequestView:
        if not self.priority:
            return running[-1]
        return max(running, key=lambda r: (r.priority, r.arrival_time))   # first of equals, as max()

    @staticmethod
    def _free_after(view: SchedulerView, plan: StepPlan) -> int:
        """Free blocks left by the plan so far, preemptions included (blocks shared between
        victims counted exactly: the view's plan_kv)."""
        needed, available = view.plan_kv(plan)
        return available - needed

    def _schedule_waiting(self, view: SchedulerView, plan: StepPlan, threshold: int, budget: int, free: int) -> None:
        """Rules 4-7: admit from waiting, head of line (every running request keeps running: this
        step preempted nobody)."""
        if not view.waiting:
            return
        tokens = plan.num_scheduled_tokens
        seqs = len(self._order)
        watermark_blocks = int(self.watermark * (view.num_total_blocks + 1))   # vLLM counts its null block
        partials = self._partials_after(view, plan, list(map(view.by_id.__getitem__, self._order))) \
            if self._caps_partials else (0, 0)
        hits_taken = False                  # an admitted request reused cached blocks
        for v in self._waiting_order(view):
            if budget <= 0 or seqs >= view.max_num_seqs:
                return
            whole = view.remaining_tokens_after(plan, v)       # (blocks this step publishes count as hits)
            n = threshold if 0 < threshold < whole else whole
            if not self.enable_chunked_prefill and n > budget:
                return
            n = min(n, budget)
            if self._caps_partials and n < whole:
                verdict = self._partial_verdict(partials, whole, threshold)
                if verdict == "stop":
                    return
                if verdict == "skip":
                    continue
            hits = bool(v.cached_blocks())
            exact = hits and hits_taken      # two admissions may reuse the same free block: count once
            need = self._need(view, plan, v, n) if exact else view.blocks_needed(v, n)
            reserve = watermark_blocks if seqs else 0
            if self.scheduler_reserve_full_isl and n < whole:
                full = self._need(view, plan, v, whole) if exact else view.blocks_needed(v, whole)
                if full + reserve > free:
                    return
            if need + reserve > free:
                return
            tokens[v.req_id] = n
            self._order.append(v.req_id)
            budget -= n
            free -= need
            seqs += 1
            hits_taken |= hits
            if self._caps_partials and n < whole:
                partials = (partials[0] + 1, partials[1] + (whole > threshold))

    def _waiting_order(self, view: SchedulerView):
        if not self.priority:
            return view.waiting
        return sorted(view.waiting, key=lambda r: (r.priority, r.arrival_time, r.req_id))

    @staticmethod
    def _need(view: SchedulerView, plan: StepPlan, v: RequestView, n: int) -> int:
        """Blocks that adding `v: n` to the plan takes, cache hits shared with the plan counted once."""
        before, _ = view.plan_kv(plan)
        trial = StepPlan({**plan.num_scheduled_tokens, v.req_id: n}, list(plan.preempt))
        return view.plan_kv(trial)[0] - before

    # ------------------------------------------- the v0 partial-prefill caps (extension)
    @property
    def _caps_partials(self) -> bool:
        return self.max_num_partial_prefills is not None or self.max_long_partial_prefills is not None

    def _partials_after(self, view: SchedulerView, plan: StepPlan, running: list) -> tuple:
        """(unfinished prefills, long ones) among the running requests after this step's chunks."""
        count = long = 0
        for v in running:
            if v.is_decode:
                continue
            left = v.remaining_tokens - plan.num_scheduled_tokens.get(v.req_id, 0)
            if left > 0:
                count += 1
                long += left > self.long_prefill_token_threshold
        return count, long

    def _partial_verdict(self, partials: tuple, whole: int, threshold: int) -> str:
        count, long = partials
        if self.max_num_partial_prefills is not None and count >= self.max_num_partial_prefills:
            return "stop"
        if self.max_long_partial_prefills is not None and whole > self.long_prefill_token_threshold \
                and long >= self.max_long_partial_prefills:
            return "skip"
        return "admit"
