"""Tool calls: a request that pauses mid-generation for a tool and resumes with its result.

An agent's LLM call stops after some output tokens to run a tool (a search, code, an API),
waits for it, then continues with the tool's result appended to its context. A trace
request lists its calls (`TraceRequest.tool_calls`: after how many output tokens, how long
the tool runs, how many tokens it returns). While the tool runs the request is PAUSED: it
is neither waiting nor running, no policy can schedule it, and its KV is, as the policy's
`on_tool_call` hook chose (InferCept's three options):

  keep     its device blocks stay held: it resumes where it stopped, at the price of the
           memory the others cannot use meanwhile
  free     its blocks are released (published in the prefix cache first): it recomputes
           what the cache no longer holds when it resumes
  offload  its computed blocks are copied to the host tier (swap preemption's mechanism and
           transfer pricing): copied back when it is scheduled again

When the tool returns, its result tokens are appended after the request's output tokens and
the request joins the waiting queue as an arrival does: the policy schedules their prefill
like any other work. The engine keeps the request's output target at the next pause point,
so its usual "reached the output length" test is where a call begins (`pause_at_calls`).

The tool's tokens sit in `Request.output_ids` (the request's one token sequence is prompt +
everything after it), but they are not output: they have no token time, and metrics count
`len(token_times)` output tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from policylab.core.admission import never_fits
from policylab.core.contract import ContractViolation
from policylab.core.extension import Extension
from policylab.core.kv import blocks_for
from policylab.core.request import Status

KV_CHOICES = ("keep", "free", "offload")
TOOL_KV_MODES = ("policy",) + KV_CHOICES


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of a request: after `after_tokens` output tokens it pauses `duration_s`
    seconds, then resumes with `result_tokens` tokens of the tool's result in its context."""

    after_tokens: int
    duration_s: float
    result_tokens: int


def check_tool_calls(calls, output_tokens: int, where: str) -> None:
    """Calls are ToolCalls in increasing `after_tokens`, each before the request's last output
    token, with a finite duration >= 0 and result tokens >= 0 (ValueError naming `where`)."""
    last = 0
    for k, c in enumerate(calls):
        if not isinstance(c, ToolCall):
            raise ValueError(f"{where}: tool_calls[{k}] must be a ToolCall, got {type(c).__name__}")
        if c.after_tokens <= last:
            raise ValueError(f"{where}: tool_calls[{k}].after_tokens={c.after_tokens} must be > "
                             f"{last} (calls in increasing order, after at least one output token)")
        if c.after_tokens >= output_tokens:
            raise ValueError(f"{where}: tool_calls[{k}].after_tokens={c.after_tokens} must be < "
                             f"output_tokens={output_tokens} (a call pauses before the last token)")
        if not 0 <= c.duration_s < math.inf:
            raise ValueError(f"{where}: tool_calls[{k}].duration_s must be a finite number of seconds "
                             f">= 0, got {c.duration_s}")
        if c.result_tokens < 1:
            raise ValueError(f"{where}: tool_calls[{k}].result_tokens must be >= 1 (a tool returns at least "
                             f"one token), got {c.result_tokens}")
        last = c.after_tokens


def has_tool_calls(trace) -> bool:
    return any(t.tool_calls for t in trace)


def default_tool_kv(view, request, call) -> str:
    """What `Policy.on_tool_call` chooses unless a policy says otherwise.

    offload when the host tier has room for its blocks: the copy each way costs milliseconds
    over the link (`engine.swap_link`), far less than a tool's duration, and the device memory
    is free for others meanwhile; else keep while nobody waits (the memory it holds is wanted by
    no one, and resuming costs nothing); else free (recompute on resume: nothing else gives its
    memory back). docs/tool-calls.md measures the three under KV pressure."""
    if view.num_total_host_blocks and view.num_free_host_blocks >= view.host_blocks_needed(request):
        return "offload"
    if not view.waiting:
        return "keep"
    return "free"


def tool_result_ids(seed: int, req_id: int, index: int, n: int, vocab_size: int) -> np.ndarray:
    """The token ids a tool returns: synthetic, the same for a seed, request and call."""
    rng = np.random.default_rng([seed, req_id, index, 0x7001])
    return rng.integers(1, max(vocab_size, 2), size=n, dtype=np.int32)


class ToolCalls(Extension):
    """The engine's side of tool calls: the paused requests, their returns (events of the replay's
    queue) and the program-level counters. Made only for traces with tool calls."""

    name = "tool_calls"
    schedules_events = True

    def __init__(self, trace: list, mode: str, host_kv_blocks: int):
        self.mode = mode
        if self.mode not in TOOL_KV_MODES:
            raise ValueError(f"engine.tool_kv must be one of {', '.join(TOOL_KV_MODES)}, got '{self.mode}'")
        if self.mode == "offload" and not host_kv_blocks:
            raise ValueError("engine.tool_kv=offload needs a host tier: set engine.host_kv_blocks > 0")
        for i, t in enumerate(trace):
            if t.tool_calls:
                check_tool_calls(t.tool_calls, t.output_tokens, f"trace request {i}")
        self.reached: dict = {}      # req_id -> calls begun so far
        self.tool_tokens: dict = {}  # req_id -> tool result tokens appended
        self.paused: dict = {}       # req_id -> (its view, KV choice, computed tokens at the pause)
        self._to_recompute: dict = {}   # req_id -> computed tokens freed at its pause (until it restarts)
        self.per_request: dict = {}  # req_id -> [calls, seconds paused, tokens recomputed, kept KV released]
        self.stats = {"tool_calls": 0, "kept": 0, "freed": 0, "offloaded": 0, "offload_fallbacks": 0,
                      "recomputed_tokens": 0, "offloaded_blocks": 0, "paused_time": 0.0, "kept_released": 0}

    def section(self):
        return self

    # ------------------------------------------------------------- engine hooks
    def admission(self, t) -> str:
        """Why a request with its tool tokens can never run ("" if it can)."""
        if not t.tool_calls:
            return ""
        kv, cfg = self.ops.kv, self.ops.cfg
        check_tool_calls(t.tool_calls, t.output_tokens, "a tool-calling request")
        return never_fits(t.prompt_tokens, t.output_tokens + t.tool_tokens, cfg.max_model_len,
                          kv.num_blocks, kv.block_size)

    def on_arrival(self, r) -> None:
        """A request arrived: its hidden target is its first pause point."""
        i = r.req_id
        if self.ops.trace_request(i).tool_calls:
            self.reached[i] = self.tool_tokens[i] = 0
            self.per_request[i] = [0, 0.0, 0, 0]
            self.ops.set_target(i, self._next_target(i))

    def _next_target(self, i: int) -> int:
        """Output ids (tool tokens included) at the request's next pause, or at its end."""
        ops, k = self.ops, self.reached[i]
        r, t = ops.request(i), ops.trace_request(i)
        end = min(t.output_tokens, r.max_tokens)
        calls = t.tool_calls
        stop = calls[k].after_tokens if k < len(calls) and calls[k].after_tokens < end else end
        return stop + self.tool_tokens[i]

    def on_tokens(self, requests: list, finished: list, now: float) -> list:
        """Of the requests that reached their target this step, those at a tool call pause (their
        KV kept, freed or offloaded, they leave running); the others really finished (returned)."""
        if not finished:
            return finished
        ops, done, paused = self.ops, [], []
        eos = ops.eos
        for r in finished:
            rid = r.req_id
            k = self.reached.get(rid)
            calls = ops.trace_request(rid).tool_calls if k is not None else ()
            if k is None or k >= len(calls) or len(r.token_times) != calls[k].after_tokens \
                    or r.output_ids[-1] == eos:
                done.append(r)
                continue
            self._pause(r, calls[k], now)
            paused.append(r)
        if paused:
            ops.leave_running(paused)
        return done

    def _pause(self, r, call: ToolCall, now: float) -> None:
        ops, rid = self.ops, r.req_id
        choice = self.mode if self.mode != "policy" else self._ask_policy(rid, call)
        if choice == "offload" and ops.kv.host_free < blocks_for(r.num_computed_tokens, ops.kv.block_size):
            choice = "free"              # (no host tier, or no room on it)
            self.stats["offload_fallbacks"] += 1
        computed = r.num_computed_tokens
        ops.stop_decoding(rid)
        if choice != "keep":
            ops.evict(r, choice == "offload")
        if choice == "offload":
            self.stats["offloaded_blocks"] += r.swapped_blocks
        elif choice == "free":
            self._to_recompute[rid] = computed
        r.status = Status.PAUSED
        self.paused[rid] = (ops.hide(rid), choice, computed)
        self.reached[rid] += 1
        self.per_request[rid][0] += 1
        self.per_request[rid][1] += call.duration_s
        self.stats["tool_calls"] += 1
        self.stats[{"keep": "kept", "free": "freed", "offload": "offloaded"}[choice]] += 1
        self.stats["paused_time"] += call.duration_s
        ops.schedule(now + call.duration_s, self._resume, rid)

    def _ask_policy(self, rid: int, call: ToolCall) -> str:
        ops = self.ops
        hook = ops.policy_hook("on_tool_call") or default_tool_kv
        view = ops.view()
        choice = hook(view, view.by_id[rid], call)
        if choice not in KV_CHOICES:
            raise ContractViolation(ops.policy_name, "tool_kv", f"on_tool_call must return one of "
                                    f"{', '.join(KV_CHOICES)}, got {choice!r}")
        return choice

    def _resume(self, rid: int, _time: float) -> None:
        """The tool has returned: the request takes its tokens and joins the waiting queue in
        front, as preempted requests do (work begun goes first; kept KV is memory only that
        request can use): the policy schedules the prefill of the tool's tokens like any work."""
        ops = self.ops
        view, _, _ = self.paused.pop(rid)
        r, call = ops.request(rid), ops.trace_request(rid).tool_calls[self.reached[rid] - 1]
        ids = tool_result_ids(ops.seed, rid, self.reached[rid] - 1, call.result_tokens, ops.vocab_size)
        r.output_ids.extend(int(x) for x in ids)
        self.tool_tokens[rid] += call.result_tokens
        ops.set_target(rid, self._next_target(rid))
        ops.show(rid, view)
        r.status = Status.WAITING
        ops.requeue([rid])

    def on_stuck(self) -> str:
        """The policy's plan is empty with requests running, or with nothing more to arrive:
        free the KV that waiting requests kept (`release_kept`: ask again), else, while paused
        requests hold the memory the running ones need, wait for the next tool to return."""
        if self.release_kept():
            return "retry"
        return "wait" if self.paused else ""

    def release_kept(self) -> bool:
        """Free the KV that waiting requests kept through their tool call (they recompute what the
        prefix cache loses), when the policy's plan is empty and the replay could not go on
        otherwise: a policy that never schedules them cannot hold that memory forever. Whether
        anything was freed."""
        ops, released = self.ops, False
        for rid in ops.waiting_ids():
            r = ops.request(rid)
            if r.block_table and rid in self.reached:
                self._to_recompute[rid] = self._to_recompute.get(rid, 0) + ops.evict(r, False)
                self.stats["kept_released"] += 1
                self.per_request[rid][3] += 1
                released = True
        return released

    def on_start(self, starting: list) -> None:
        """Requests just started: those freed at a tool call recompute what the cache lost."""
        for r in starting:
            lost = self._to_recompute.pop(r.req_id, None)
            if lost is not None:
                n = max(lost - r.num_computed_tokens, 0)
                self.per_request[r.req_id][2] += n
                self.stats["recomputed_tokens"] += n
