"""Base class of scheduling policies (the plugins under `policies/`).

A policy reads a `SchedulerView` and returns a `StepPlan`; it never allocates KV
blocks or mutates requests. The engine validates the plan, then carries it out.
"""
from __future__ import annotations

from policylab.core.contract import SchedulerView, StepPlan
from policylab.core.extensions.tool_calls import default_tool_kv


class Policy:
    """Subclass and implement `schedule`. Constructor keywords come from the policy YAML.

    `features`: the engine features its plans use beyond the core contract (`"swap"`: it preempts
    by swap; `"speculation"`: it gives decodes draft tokens), so that a run that cannot serve them
    is refused before it starts (policylab.core.features)."""

    features: tuple = ()
    engine_defaults: dict = {}     # engine.* settings the policy is written for, unless the run sets them
                                   # (vllm_v1: {"length_limit": "stop"}, vLLM's handling of max_model_len)

    def __init__(self, name: str | None = None):
        self.name = name or type(self).__name__

    def schedule(self, view: SchedulerView) -> StepPlan:
        raise NotImplementedError

    def on_finished(self, req_view) -> None:
        """Called once when a request finishes or is rejected (optional bookkeeping hook)."""

    def on_tool_call(self, view: SchedulerView, request, call) -> str:
        """A running request pauses for a tool call (`call`: after_tokens, duration_s,
        result_tokens): what becomes of its KV while the tool runs, "keep" | "free" | "offload"
        (engine.tool_kv=policy; policylab.core.extensions.tool_calls). The default: offload when the host
        tier has room, else keep while nobody waits, else free (`default_tool_kv`)."""
        return default_tool_kv(view, request, call)
