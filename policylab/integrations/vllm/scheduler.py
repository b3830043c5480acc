"""`PolicyScheduler`: vLLM v1's scheduler with its decisions made by a policylab policy.

vLLM builds its scheduler from `scheduler_cls` (`LLM(scheduler_cls=...)`, `vllm serve
--scheduler-cls policylab.integrations.vllm.PolicyScheduler`). This subclass keeps all of
vLLM's request bookkeeping (queues, KV cache manager, outputs, stop checks, metrics) and
replaces only the decision: every step it shows the policy policylab's `SchedulerView` of
vLLM's own state (`view.py`), validates the returned `StepPlan` with policylab's contract
(a broken rule raises the same `ContractViolation` the simulator raises, which ends vLLM's
engine loop), then carries the plan out with vLLM's primitives:

- rejections finish the request (`FINISHED_ABORTED`, the reason as its stop reason);
- preemptions free the victim's blocks and put it back in front of the waiting queue
  (`_preempt_request`), in the plan's order;
- the prefix-cache hits the policy planned with are adopted for every starting request before
  any new block is allocated (as policylab's engine does), then each scheduled request gets
  exactly its planned tokens (`allocate_slots`), in plan order; any number of partial
  prefills, of any sizes;
- the `SchedulerOutput` is built as vLLM's own `schedule()` builds it.

What it refuses, at start, with one line each: async scheduling (the policy would see a view
one step stale), several KV cache groups or sliding-window attention (hybrid models: the
view has one block table per request), speculative decoding, KV connectors (P/D
disaggregation and offloading move KV outside the scheduler's plan), pipeline parallelism,
LoRA and multimodal inputs.
"""
from __future__ import annotations

import os
import time

from vllm.logger import init_logger
from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreEventType, EngineCoreOutput, EngineCoreOutputs
from vllm.v1.request import RequestStatus

from policylab.core.admission import never_fits
from policylab.core.contract import ContractViolation
from policylab.core.plan_rules import validate_plan
from policylab.core.result import STEP_FIELDS
from policylab.integrations.vllm.policy_config import load_policy, policy_spec_from_env
from policylab.integrations.vllm.support import check_supported
from policylab.integrations.vllm.view import LiveKV, LiveRequest, build_view, hits_of, new_request_view

logger = init_logger("vllm.policylab")         # under vLLM's logger: its handlers, in every process

PLAN_LOG_ENV = "POLICYLAB_LOG_PLANS"      # "1": one log line per applied plan (tests, debugging)
META_KEY = "policylab"                    # SamplingParams.extra_args[META_KEY]: client, SLOs, prediction
READY = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


class PolicyScheduler(Scheduler):
    """vLLM's scheduler driven by a policylab policy (see the module docstring).

    The policy comes from `policy_spec` (a subclass made by `with_policy`) or else from the
    environment (`POLICYLAB_POLICY`, see `policy_config`). `clock` (seconds, a callable) is what
    the view's `clock` and the token times read: time since the scheduler started unless set.
    """

    policy_spec = None
    clock = None

    @classmethod
    def with_policy(cls, spec, clock=None) -> type:
        """A subclass bound to one policy spec (a name, 'name key=value ...', a YAML path or a
        `{_target_ | name, params}` dict) and optionally a clock: for `LLM(scheduler_cls=...)`."""
        return type(cls.__name__, (cls,), {"policy_spec": spec, "clock": staticmethod(clock) if clock else None,
                                           "__module__": cls.__module__})

    def __init__(self, vllm_config, kv_cache_config, *args, **kwargs):
        check_supported(vllm_config, kv_cache_config)
        super().__init__(vllm_config, kv_cache_config, *args, **kwargs)
        spec = self.policy_spec if self.policy_spec is not None else policy_spec_from_env()
        self.policylab_policy = load_policy(spec)
        self.policy_name = getattr(self.policylab_policy, "name", type(self.policylab_policy).__name__)
        self._kv = LiveKV(self.kv_cache_manager, self.block_size)
        if self.clock is None:
            t0 = time.monotonic()
            self._now = lambda: time.monotonic() - t0
        else:
            self._now = self.clock
        self._live: dict = {}            # int id -> LiveRequest, live requests only
        self._views: dict = {}           # int id -> RequestView (the view's by_id)
        self._int_id: dict = {}          # vLLM request id -> int id
        self._next_id = 0
        self._waiting_order: list = []   # int ids, policylab's queue order
        self._sampled: list = []         # since the last schedule(): ids given a token
        self._arrived: list = []         #   and ids that arrived
        self._rejected: list = []        # vLLM requests rejected by the plan, their outputs not yet sent
        self._step_start = None
        self._step_counts = None
        self.step_index = 0
        self.step_rows = None            # a list: one row per executed step is appended, in policylab's
                                         #   STEP_FIELDS order (a replay's steps.parquet; a server keeps none)
        self.on_request_done = None      # callback(LiveRequest) when a request leaves (results writers)
        self.batch_log = None            # a list: each executed step's (query lens, context lens, sampled,
        self._batch = None               #   seconds) are appended (calibrating the simulator on vLLM)
        self._log_plans = os.environ.get(PLAN_LOG_ENV, "") not in ("", "0")
        logger.info("policylab PolicyScheduler: policy '%s' schedules this engine (%d KV blocks of %d tokens)",
                    self.policy_name, self._kv.num_blocks, self.block_size)

    # ------------------------------------------------------------ requests
    def add_request(self, request) -> None:
        if request.has_encoder_inputs:
            raise ValueError("policylab PolicyScheduler does not schedule multimodal inputs")
        super().add_request(request)
        rid = self._next_id
        self._next_id += 1
        extra = request.sampling_params.extra_args if request.sampling_params is not None else None
        meta = (extra or {}).get(META_KEY) or {}
        live = LiveRequest(rid, request, self._kv, self._now(), meta)
        self._live[rid] = live
        self._views[rid] = new_request_view(live, self._kv)
        self._int_id[request.request_id] = rid
        reason = never_fits(request.num_prompt_tokens, request.max_tokens, self.max_model_len, self._kv.num_blocks,
                            self.block_size, stop_at_limit=True)    # (vLLM stops a long one at max_model_len)
        if reason:                       # as policylab's engine: refused on arrival, no policy sees it
            self._views.pop(rid)
            self._reject(live, reason)
            return
        self._waiting_order.append(rid)
        self._arrived.append(rid)

    def _reject(self, live: LiveRequest, reason: str) -> None:
        """Finish a waiting request unserved; its output (no tokens, the reason as stop reason) goes
        out with the next step's outputs."""
        live.reject_reason = reason
        live.vllm.stop_reason = reason
        self._rejected.append(live.vllm)
        self.finish_requests(live.vllm.request_id, RequestStatus.FINISHED_ABORTED)

    def finish_requests(self, request_ids, finished_status):
        finished = super().finish_requests(request_ids, finished_status)
        for request in finished:
            self._leave(request)
        return finished

    def _leave(self, request) -> None:
        """A request finished, was aborted or rejected: the policy hears of it once."""
        rid = self._int_id.pop(request.request_id, None)
        if rid is None:
            return
        view = self._views.pop(rid, None)
        live = self._live.pop(rid)
        if rid in self._waiting_order:
            self._waiting_order.remove(rid)
        if view is not None:
            self.policylab_policy.on_finished(view)
        if self.on_request_done is not None:
            self.on_request_done(live)

    # ------------------------------------------------------------ schedule
    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        self.current_step += 1
        self.kv_cache_manager.new_step_starts()
        now = self._now()
        self._kv.new_step()
        views = self._views
        waiting = tuple(views[rid] for rid in self._waiting_order if self._ready(self._live[rid].vllm))
        int_id = self._int_id
        running = tuple([views[int_id[r.request_id]] for r in self.running])
        view = build_view(now, self.step_index, waiting, running, self.running, self.max_num_scheduled_tokens,
                          self.max_num_running_reqs, self._kv, views, self._sampled, self._arrived)
        plan = self.policylab_policy.schedule(view)
        self._sampled, self._arrived = [], []
        if any((getattr(plan, "spec_tokens", None) or {}).values()):
            from policylab.core.extensions.speculation import VLLM_REFUSAL
            raise ContractViolation(self.policy_name, "spec_unsupported", VLLM_REFUSAL)
        validate_plan(view, plan, self.policy_name)
        return self._apply(view, plan, now)

    def _ready(self, request) -> bool:
        """A waiting request the policy may schedule (grammar compiled, not streaming-paused)."""
        return request.status in READY or self._handle_blocked_waiting_request(request)

    def _apply(self, view, plan, now: float) -> SchedulerOutput:
        live, bs, kvm = self._live, self.block_size, self.kv_cache_manager
        stamp = time.monotonic()
        for rid, reason in plan.reject.items():
            self._reject(live[rid], f"rejected by policy: {reason}")
        if plan.preempt:
            victims = [live[rid].vllm for rid in plan.preempt]
            gone = set(victims)
            self.running = [r for r in self.running if r not in gone]
            for request in reversed(victims):     # vLLM prepends: the plan's first ends up first
                self._preempt_request(request, stamp)
            self._waiting_order[:0] = plan.preempt
        sched = plan.num_scheduled_tokens
        decoding = view.decoding
        if len(decoding) == len(sched) and sched.keys() == decoding:   # decodes only: no start, no prefill
            starting_ids, prefill_tokens, n_prefill = [], 0, 0
        else:
            starting_ids = [rid for rid in sched if live[rid].vllm.status in READY]
            if len(starting_ids) > 1:
                position = {rid: i for i, rid in enumerate(self._waiting_order)}
                starting_ids.sort(key=position.__getitem__)
            prefill_tokens = n_prefill = 0
            for rid, n in sched.items():
                if n > 1 or not live[rid].vllm.num_output_tokens:
                    prefill_tokens += n
                    n_prefill += 1
        for rid in starting_ids:                 # every planned hit adopted before any allocation
            request, hits = live[rid].vllm, hits_of(self._views[rid])
            if hits:
                blocks = kvm.create_kv_cache_blocks(([self._kv.block(b) for b in hits],))
                adopted = kvm.allocate_slots(request, 0, num_new_computed_tokens=len(hits) * bs,
                                             new_computed_blocks=blocks, has_scheduled_reqs=False)
                if adopted is None:
                    raise RuntimeError(self._disagreement(rid, 0, view))
                request.num_computed_tokens = len(hits) * bs
            kvm.record_prefix_cache_stats(request, len(hits) * bs)
        new_blocks, num_scheduled, allocate, lookahead = {}, {}, kvm.allocate_slots, self.num_lookahead_tokens
        scheduled_requests = [live[rid].vllm for rid in sched]
        for request, n in zip(scheduled_requests, sched.values()):
            blocks = allocate(request, n, num_lookahead_tokens=lookahead, has_scheduled_reqs=False)
            if blocks is None:
                raise RuntimeError(self._disagreement(self._int_id[request.request_id], n, view))
            new_blocks[request.request_id] = blocks
            num_scheduled[request.request_id] = n
        if self.batch_log is not None:
            q = list(sched.values())
            ctx = [live[rid].vllm.num_computed_tokens for rid in sched]
            sampled = sum(1 for rid, n, c in zip(sched, q, ctx) if c + n >= live[rid].vllm.num_tokens)
            self._batch = (q, ctx, sampled)
        scheduled_new, scheduled_resumed = [], []
        if starting_ids:
            started = set(starting_ids)
            self._waiting_order = [rid for rid in self._waiting_order if rid not in started]
        for rid in starting_ids:
            request = live[rid].vllm
            self.waiting.remove_request(request)
            self.deferred_waiting.discard(request)
            (scheduled_new if request.status == RequestStatus.WAITING else scheduled_resumed).append(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            new_blocks[request.request_id] = kvm.get_blocks(request.request_id)
            if live[rid].first_scheduled_time is None:
                live[rid].first_scheduled_time = now
            if self.log_stats:
                request.record_event(EngineCoreEventType.SCHEDULED, stamp)
        if starting_ids:
            started_set = set(scheduled_new) | set(scheduled_resumed)
            scheduled_running = [r for r in scheduled_requests if r not in started_set]
        else:
            scheduled_running = scheduled_requests
        self._step_start = now
        self._step_counts = (prefill_tokens, n_prefill, len(plan.preempt), len(plan.reject))
        if self._log_plans:
            logger.info("policylab plan step=%d policy=%s requests=%d tokens=%d prefill_tokens=%d preempt=%d "
                        "reject=%d started=%d validated=1", self.step_index, self.policy_name, len(sched),
                        sum(sched.values()), prefill_tokens, len(plan.preempt), len(plan.reject), len(starting_ids))
        return self._output(scheduled_new, scheduled_resumed, scheduled_running, num_scheduled, new_blocks)

    def _disagreement(self, rid: int, n: int, view) -> str:
        return (f"policylab PolicyScheduler: vLLM could not allocate KV for request {rid} ({n} tokens) although "
                f"policy '{self.policy_name}''s plan passed the contract with {view.num_free_blocks} free blocks; "
                "the view and vLLM's KV cache manager disagree")

    def _output(self, scheduled_new, scheduled_resumed, scheduled_running, num_scheduled, new_blocks):
        """The SchedulerOutput, built as vLLM's own schedule() builds it (no spec decode, no
        encoder inputs, no connector)."""
        if self.use_v2_model_runner:
            scheduled_new = scheduled_new + scheduled_resumed
            scheduled_resumed = []
            new_data = [NewRequestData.from_request(r, new_blocks[r.request_id].get_block_ids(), r._all_token_ids,
                                                    uses_mrope=self.model_uses_mrope) for r in scheduled_new]
        else:
            new_data = [NewRequestData.from_request(r, new_blocks[r.request_id].get_block_ids(),
                                                    uses_mrope=self.model_uses_mrope) for r in scheduled_new]
        cached = self._make_cached_request_data(scheduled_running, scheduled_resumed, num_scheduled, {}, new_blocks)
        if not self.use_v2_model_runner:
            self.prev_step_scheduled_req_ids.clear()
            self.prev_step_scheduled_req_ids.update(num_scheduled)
        self.kv_cache_manager.take_boundary_state_offloads()
        copies, retained = self.kv_cache_manager.take_kv_cache_block_copies()
        if copies:
            self._free_cow_retained_blocks(retained, self.sched_step_seq + 1)
        output = SchedulerOutput(
            scheduled_new_reqs=new_data,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            scheduled_spec_decode_tokens={},
            scheduled_encoder_inputs={},
            preempted_req_ids=self.reset_preempted_req_ids,
            finished_req_ids=self.finished_req_ids,
            free_encoder_mm_hashes=self.encoder_cache_manager.get_freed_mm_hashes(),
            new_block_ids_to_zero=self._get_new_block_ids_to_zero(),
            kv_cache_block_copies=copies or None,
            num_spec_tokens_to_schedule=self.num_spec_tokens,
            ec_manager_metadata=self.encoder_cache_manager.get_manager_metadata(),
        )
        self._update_after_schedule(output)
        return output

    # ------------------------------------------------------------ outputs
    def update_from_output(self, scheduler_output, model_runner_output):
        sched = scheduler_output.num_scheduled_tokens
        int_id, lives = self._int_id, self._live
        scheduled = [lives[int_id[rid]] for rid in sched if rid in int_id]
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        now = self._now()
        sampled = model_runner_output.sampled_token_ids
        index = model_runner_output.req_id_to_index
        got = self._sampled
        for live in scheduled:
            request = live.vllm
            i = index.get(request.request_id) if sampled else None
            if i is not None:
                tokens = sampled[i]
                if tokens:
                    got.append(live.req_id)
                    if len(tokens) == 1:
                        live.token_times.append(now)
                    else:
                        live.token_times.extend([now] * len(tokens))
            if request.status > RequestStatus.PREEMPTED:      # RequestStatus.is_finished, inlined
                self._leave(request)
        for request in self._rejected:
            outs = outputs.get(request.client_index)
            if outs is None:
                outs = outputs[request.client_index] = EngineCoreOutputs()
            outs.outputs.append(EngineCoreOutput(request_id=request.request_id, new_token_ids=[],
                                                 finish_reason=request.get_finished_reason(),
                                                 stop_reason=request.stop_reason, events=request.take_events()))
        self._rejected = []
        if sched:
            self.step_index += 1
            if self.step_rows is not None:
                self._record(now, scheduler_output)
        return outputs

    def _record(self, now: float, scheduler_output) -> None:
        prefill_tokens, n_prefill, preempted, rejected = self._step_counts
        size, tokens = len(scheduler_output.num_scheduled_tokens), scheduler_output.total_num_scheduled_tokens
        self.step_rows.append([self._step_start, now - self._step_start, size, prefill_tokens,
                               tokens - prefill_tokens, n_prefill, size - n_prefill, self._kv.num_used,
                               len(self._waiting_order), len(self.running), preempted, rejected])
        if self.batch_log is not None and self._batch is not None:
            self.batch_log.append((*self._batch, now - self._step_start))


assert len(STEP_FIELDS) == 12, "PolicyScheduler._record writes policylab's 12 step fields"
__all__ = ["PolicyScheduler", "META_KEY"]
