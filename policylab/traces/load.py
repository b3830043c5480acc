"""`load_trace`: the one entry point the engine uses (read any format, then transform)."""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from importlib.resources import files
from pathlib import Path
from typing import Optional

from policylab.core.request import MAX_ARRIVAL_S
from policylab.datasets.cache import DatasetError
from policylab.datasets.cache import resolve as resolve_dataset
from policylab.datasets.catalog import TRACES
from policylab.traces.csv_table import unreadable_as_trace_error
from policylab.traces.errors import TraceError
from policylab.traces.formats import detect_format, read_requests
from policylab.traces.loaded import LoadedTrace  # noqa: F401  (load_trace's result type)
from policylab.traces.session_load import is_closed_loop, load_closed_loop
from policylab.traces.transforms import TraceReport, apply_transforms, check_config

log = logging.getLogger("policylab.traces")
SHIPPED_TRACES = Path(str(files("policylab.shipped_traces")))   # the repository's traces/, in the wheel too


def resolve_path(path, dataset: Optional[str] = None, cache_dir: Optional[str] = None) -> Path:
    """A relative path is looked up in the cwd first; `traces/NAME` then among the shipped traces;
    a downloadable trace's name (or `dataset` when no path is given) in the download cache."""
    text = "" if path is None else str(path)
    if text in ("", "???") and dataset:
        return _downloaded(dataset, cache_dir)
    if text in ("", "???"):
        raise TraceError("trace config", None, "trace.path", "no trace file given: add trace.path=FILE "
                         "or a downloaded trace (python -m policylab trace list)")
    if text in TRACES and not Path(text).exists():
        return _downloaded(text, cache_dir)
    p = Path(text).expanduser()
    candidates = [p]
    if not p.is_absolute():
        shipped = [SHIPPED_TRACES.joinpath(*p.parts[1:])] if p.parts[0] == "traces" and len(p.parts) > 1 else []
        candidates = list(dict.fromkeys([Path.cwd() / p, *shipped]))
    for c in candidates:
        if c.is_file():
            return c
    for c in candidates:            # (a FIFO would block the read; a directory is no trace)
        if c.exists():
            what = "a directory" if c.is_dir() else "not a regular file (a FIFO, socket or device)"
            raise TraceError(text, None, None, f"{c} is {what}: give a trace file (CSV, JSON lines, parquet)")
    raise TraceError(text, None, None, "file not found (looked in: "
                     + ", ".join(str(c) for c in candidates) + ")")


def _downloaded(name: str, cache_dir: Optional[str]) -> Path:
    try:
        return resolve_dataset("trace", name, cache_dir)
    except DatasetError as e:
        raise TraceError("trace config", None, None, str(e)) from None


def _plain(value):
    """Hydra's DictConfig -> plain dicts, so readers and transforms see ordinary Python values."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [_plain(v) for v in value]
    return value


def load_trace(cfg, seed: int = 0) -> LoadedTrace:
    """Requests of the trace `cfg` selects, sorted by arrival, first at 0.0 s (or relative to the
    window's start_time), with cfg's transforms applied. `.report` says what was skipped/clipped."""
    given = cfg.path
    check_config(cfg)
    path = resolve_path(given, cfg.dataset, cfg.cache_dir)
    name = str(given) if given not in (None, "", "???") else str(cfg.dataset)
    with unreadable_as_trace_error(path, name):
        fmt = detect_format(path, name) if cfg.format == "auto" else cfg.format
        if is_closed_loop(cfg, fmt):
            return load_closed_loop(cfg, path, name, fmt, _plain(cfg.extra),
                                    lambda: load_trace(replace(cfg, concurrency=None, format=fmt), seed), seed)
        report = TraceReport(name, fmt, skipped=Counter())
        client_column = cfg.client_column if cfg.client_assignment == "column" else None
        raw = list(read_requests(path, name, fmt, report.skipped, client_column, _plain(cfg.extra)))
    trace = LoadedTrace(apply_transforms(raw, cfg, seed, report))
    trace.report = report
    if not trace:
        raise TraceError(name, None, None, f"no requests left to replay ({report.summary()})")
    last = max(t.arrival_time for t in trace)
    if last > MAX_ARRIVAL_S:
        raise TraceError(name, None, "arrival_time", f"a request arrives {last:.6g} s after the trace's first; "
                         f"at most {MAX_ARRIVAL_S:g} s (31 years) keeps latencies exact in float64 seconds")
    log.log(logging.WARNING if report.skipped or report.clipped_prompts or report.clipped_outputs
            else logging.INFO, "trace: %s", report.summary())
    return trace
