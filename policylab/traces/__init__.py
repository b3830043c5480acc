"""Arrival traces: read (native + public formats), generate, transform, inspect.

The engine only needs `load_trace(cfg, seed)`; `python -m policylab trace ...` (cli.py) is the
command-line face of the rest.
"""
from policylab.traces.config import TraceConfig
from policylab.traces.errors import TraceError
from policylab.traces.load import LoadedTrace, load_trace, resolve_path
from policylab.traces.native import write_native
from policylab.traces.transforms import TraceReport

__all__ = ["TraceConfig", "TraceError", "LoadedTrace", "TraceReport", "load_trace", "resolve_path",
           "write_native"]
