"""Loading a closed-loop workload: a session trace, the sessions of a public trace
(`trace.sessions=true`), or any trace run by `trace.concurrency` users (docs/sessions.md).

The result is the engines' trace (one placeholder request per turn, see core.extensions.sessions)
carrying its `SessionPlan` as `.sessions`; only the transforms that mean something for a
conversation apply to sessions (`rate_scale` on session starts, `max_requests` as whole
sessions, length clipping per turn); the others are refused with a message.
"""
from __future__ import annotations

import inspect
from collections import Counter
from dataclasses import replace

import numpy as np

from policylab.core.request import MAX_ARRIVAL_S
from policylab.traces.config import TraceConfig
from policylab.traces.errors import TraceError
from policylab.traces.loaded import LoadedTrace
from policylab.traces.session_sources import read_burstgpt_sessions, read_mooncake_sessions
from policylab.traces.sessions import FORMAT, clip_sessions, one_turn_sessions, plan_of, read_sessions
from policylab.traces.tool_calls import add_tool_calls
from policylab.traces.transforms import TraceReport

SESSION_TRANSFORMS = ("rate_scale", "max_requests", "max_prompt_tokens", "max_output_tokens", "tool_calls")
NOT_FOR_SESSIONS = ("start_time", "end_time", "sample_fraction", "repeat", "replicate", "client_assignment",
                    "slo_by_client", "slo_ratio")
READERS = {FORMAT: lambda path, name, skipped: read_sessions(path, name),
           "burstgpt": read_burstgpt_sessions, "mooncake": read_mooncake_sessions}


def is_closed_loop(cfg: TraceConfig, fmt: str) -> bool:
    return fmt == FORMAT or bool(cfg.sessions) or cfg.concurrency is not None


def check_session_config(cfg: TraceConfig, fmt: str) -> None:
    if cfg.concurrency is not None and (isinstance(cfg.concurrency, bool) or not isinstance(cfg.concurrency, int)
                                        or cfg.concurrency < 1):
        raise TraceError("trace config", None, "trace.concurrency",
                         f"must be a number of closed-loop users >= 1 (or null: open loop), got {cfg.concurrency!r}")
    if not (fmt == FORMAT or cfg.sessions):
        return
    if fmt not in READERS:
        raise TraceError("trace config", None, "trace.sessions", f"the {fmt} format records no sessions; "
                         "sessions come from a session trace, BurstGPT's 'Session ID' column or "
                         "Mooncake's chained hash ids")
    defaults = TraceConfig()
    for name in NOT_FOR_SESSIONS:
        if getattr(cfg, name) != getattr(defaults, name):
            raise TraceError("trace config", None, f"trace.{name}", "does not apply to sessions (a conversation "
                             f"is kept whole); session traces take {', '.join(SESSION_TRANSFORMS)}")


def load_closed_loop(cfg: TraceConfig, path, name: str, fmt: str, options: dict, open_loop=None, seed: int = 0):
    """(the engines' trace, its report): sessions read from `path`, or `open_loop()` (the trace as
    `load_trace` reads it) as one-turn sessions for `trace.concurrency` users."""
    check_session_config(cfg, fmt)
    report = TraceReport(name, fmt, skipped=Counter())
    if fmt == FORMAT or cfg.sessions:
        reader = READERS[fmt]
        accepted = [p for p in inspect.signature(reader).parameters if p not in ("path", "name", "skipped", "kw")]
        for key in options:
            if key not in accepted:
                raise TraceError(name, None, f"extra.{key}", f"not an option of the {fmt} reader of sessions "
                                 f"(it takes: {', '.join(accepted) or 'none'})")
        sessions = reader(path, name, report.skipped, **options)
        report.read = sum(len(s.turns) for s in sessions)
        sessions = _transformed(sessions, cfg, report, seed)
    else:
        trace = open_loop()
        report = trace.report
        sessions = one_turn_sessions(trace)
    if not sessions:
        raise TraceError(name, None, None, f"no sessions left to replay ({report.summary()})")
    return closed_loop_trace(plan_of(sessions, cfg.concurrency), report)


def closed_loop_trace(plan, report: TraceReport) -> LoadedTrace:
    """The engines' trace of `plan` (its placeholders), carrying the plan as `.sessions`."""
    out = LoadedTrace(plan.trace)
    out.report, out.sessions = report, plan
    report.kept = len(plan.trace)
    return out


def _transformed(sessions: list, cfg: TraceConfig, report: TraceReport, seed: int) -> list:
    origin = min(s.start for s in sessions) if sessions else 0.0
    sessions = [replace(s, start=(s.start - origin) / cfg.rate_scale) for s in sorted(sessions, key=lambda s: s.start)]
    if sessions and sessions[-1].start > MAX_ARRIVAL_S:
        raise TraceError(report.file, None, "arrival_time", f"sessions start over {sessions[-1].start:.3g} s (at "
                         f"trace.rate_scale={cfg.rate_scale:g}); at most {MAX_ARRIVAL_S:g} s keeps latencies exact "
                         "in float64 seconds")
    if cfg.max_requests is not None:
        kept, turns = [], 0
        for s in sessions:
            if turns + len(s.turns) > cfg.max_requests:
                break
            kept.append(s)
            turns += len(s.turns)
        report.over_max_requests = sum(len(s.turns) for s in sessions) - turns
        sessions = kept
    sessions, (report.clipped_prompts, report.clipped_outputs) = clip_sessions(
        sessions, cfg.max_prompt_tokens, cfg.max_output_tokens)
    if cfg.tool_calls:               # a turn pauses for tools as any request does (seeded per turn)
        turns = [t for s in sessions for t in s.turns]
        calls = iter(add_tool_calls([t.output_tokens for t in turns], dict(cfg.tool_calls),
                                    np.random.default_rng([seed, 5])))
        sessions = [replace(s, turns=tuple(t if t.tool_calls else replace(t, tool_calls=next(calls))
                                           for t in s.turns)) for s in sessions]
    return sessions

