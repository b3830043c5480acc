"""policylab policies inside vLLM v1: `PolicyScheduler` (vLLM's `scheduler_cls`) and trace replay.

vLLM is imported only when `PolicyScheduler` (or a module that needs vLLM) is first used, so
`import policylab.integrations.vllm` works without it and nothing in policylab's core imports it.
"""
from __future__ import annotations

__all__ = ["PolicyScheduler"]


def __getattr__(name: str):
    if name == "PolicyScheduler":
        from policylab.integrations.vllm.scheduler import PolicyScheduler
        return PolicyScheduler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
