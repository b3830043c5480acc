"""What `load_trace` returns: its own module, so the open-loop and closed-loop loaders
(traces.load, traces.session_load) share it without importing each other."""
from __future__ import annotations

from policylab.traces.transforms import TraceReport


class LoadedTrace(list):
    """A list of TraceRequest (arrival order) that also carries its TraceReport as `.report`."""

    report: TraceReport
    sessions = None                  # a closed-loop workload's SessionPlan (core.extensions.sessions); None: open loop
