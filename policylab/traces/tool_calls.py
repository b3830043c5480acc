"""Tool calls in traces: the native `tool_calls` field, and a seeded transform that adds calls to
any trace (public traces, Mooncake's toolagent one included, record no tool timings).

Native field: `"tool_calls": [{"after_tokens": 40, "duration_s": 1.5, "result_tokens": 120}, ...]`,
calls in increasing `after_tokens`, each before the request's last output token.

Transform (`trace.tool_calls`, off when empty): each request draws, with probability
`fraction`, `calls` tool calls at evenly spread points of its output, each lasting an
exponentially distributed time of mean `duration_s` (or exactly it with `fixed_duration`)
and returning `result_tokens` tokens; requests too short for a call keep none.
"""
from __future__ import annotations

import math

import numpy as np

from policylab.core.request import MAX_ARRIVAL_S
from policylab.core.extensions.tool_calls import ToolCall
from policylab.traces.errors import TraceError, shown

KEYS = ("after_tokens", "duration_s", "result_tokens")
TRANSFORM_KEYS = {"calls": 1, "duration_s": 1.0, "result_tokens": 64, "fraction": 1.0, "fixed_duration": False}
MAX_DURATION_S = MAX_ARRIVAL_S   # s: as far as an arrival may be (DESIGN §5)


def parse_tool_calls(value, output_tokens: int, file, line) -> tuple:
    """The `tool_calls` field of one native record as ToolCalls, or a TraceError naming the call
    and the key (`tool_calls[1].duration_s`)."""
    if not isinstance(value, (list, tuple)):
        raise TraceError(file, line, "tool_calls", f"expected a list of calls, got {shown(value)}")
    calls, last = [], 0
    for k, call in enumerate(value):
        where = f"tool_calls[{k}]"
        if not isinstance(call, dict):
            raise TraceError(file, line, where, f"expected an object with {', '.join(KEYS)}, got {shown(call)}")
        for key in call:
            if key not in KEYS:
                raise TraceError(file, line, f"{where}.{key}", f"unknown key; a tool call has {', '.join(KEYS)}")
        for key in KEYS:
            if key not in call:
                raise TraceError(file, line, f"{where}.{key}", "missing (required)")
        after, duration, result = call["after_tokens"], call["duration_s"], call["result_tokens"]
        if isinstance(after, bool) or not isinstance(after, int) or not last < after < output_tokens:
            raise TraceError(file, line, f"{where}.after_tokens", f"expected an integer in ({last}, "
                             f"{output_tokens}) (after the previous call, before the last of the "
                             f"{output_tokens} output tokens), got {shown(after)}")
        if isinstance(duration, bool) or not isinstance(duration, (int, float)) \
                or not 0 <= duration <= MAX_DURATION_S:
            raise TraceError(file, line, f"{where}.duration_s", f"expected a finite number of seconds >= 0, "
                             f"got {shown(duration)}")
        if isinstance(result, bool) or not isinstance(result, int) or not 1 <= result <= 10**9:
            raise TraceError(file, line, f"{where}.result_tokens", f"expected a positive integer, got {shown(result)}")
        calls.append(ToolCall(after, float(duration), result))
        last = after
    return tuple(calls)


def record_of_calls(calls: tuple) -> list:
    return [{"after_tokens": c.after_tokens, "duration_s": c.duration_s, "result_tokens": c.result_tokens}
            for c in calls]


def check_transform(spec: dict) -> dict:
    """`trace.tool_calls` with its defaults filled in, or a TraceError naming the bad key."""
    def bad(key, message):
        return TraceError("trace config", None, f"trace.tool_calls.{key}", message)
    for key in spec:
        if key not in TRANSFORM_KEYS:
            raise bad(key, f"unknown key; trace.tool_calls has {', '.join(TRANSFORM_KEYS)}")
    out = {**TRANSFORM_KEYS, **spec}
    if isinstance(out["calls"], bool) or not isinstance(out["calls"], int) or out["calls"] < 1:
        raise bad("calls", f"must be an integer >= 1, got {out['calls']!r}")
    if isinstance(out["result_tokens"], bool) or not isinstance(out["result_tokens"], int) or out["result_tokens"] < 1:
        raise bad("result_tokens", f"must be an integer >= 1, got {out['result_tokens']!r}")
    d = out["duration_s"]
    if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d <= MAX_DURATION_S:
        raise bad("duration_s", f"must be a finite number of seconds >= 0, got {d!r}")
    f = out["fraction"]
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= 1:
        raise bad("fraction", f"must be in [0, 1], got {f!r}")
    if not isinstance(out["fixed_duration"], bool):
        raise bad("fixed_duration", f"must be true or false, got {out['fixed_duration']!r}")
    return out


def add_tool_calls(output_tokens: list, spec: dict, rng: np.random.Generator) -> list:
    """Tool calls (a tuple per request, of the given output lengths) drawn as `spec` says."""
    spec = check_transform(spec)
    k, mean = spec["calls"], float(spec["duration_s"])
    draws = rng.random(len(output_tokens))
    durations = np.full((len(output_tokens), k), mean) if spec["fixed_duration"] else \
        rng.exponential(mean, size=(len(output_tokens), k)) if mean > 0 else np.zeros((len(output_tokens), k))
    out = []
    for i, n in enumerate(output_tokens):
        calls = min(k, n - 1)
        if draws[i] >= spec["fraction"] or calls < 1:
            out.append(())
            continue
        points = sorted({max(1, min(n - 1, math.floor(n * (j + 1) / (calls + 1)))) for j in range(calls)})
        out.append(tuple(ToolCall(p, float(durations[i, j]), spec["result_tokens"]) for j, p in enumerate(points)))
    return out


def clip_tool_calls(calls: tuple, output_tokens: int) -> tuple:
    """The calls that still come before the last output token (after `max_output_tokens` clipped it)."""
    return tuple(c for c in calls if c.after_tokens < output_tokens)
