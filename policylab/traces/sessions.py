"""Session traces: multi-turn conversations replayed in closed loop (docs/sessions.md).

A session trace has one JSON object per line, one line per turn:

    {"session": "s1", "turn": 0, "arrival_time": 0.0, "new_tokens": 200, "output_tokens": 50}
    {"session": "s1", "turn": 1, "think_time": 4.0, "new_tokens": 30, "output_tokens": 80}

Turn 0 carries the session's `arrival_time`; turn k+1 carries the `think_time` (s, >= 0,
default 0) after turn k finished. A turn's prompt is the conversation so far plus its
`new_tokens`. Optional per turn: `client` (default: the session id, so that `router=session`
keeps a conversation on one replica), `priority`, `ttft_slo`, `tpot_slo`, `max_tokens`; on turn
0 only, `prefix_hashes` (a system prompt shared with other sessions). Lines may come in any
order; every session needs turns 0..K-1, each once.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Optional

import policylab.traces.fields as F
from policylab.core.extensions.sessions import SessionPlan
from policylab.core.request import TraceRequest
from policylab.traces.errors import TraceError
from policylab.traces.tool_calls import clip_tool_calls

FORMAT = "sessions"
REQUIRED = ("session", "turn", "new_tokens", "output_tokens")
OPTIONAL = ("arrival_time", "think_time", "client", "priority", "ttft_slo", "tpot_slo", "max_tokens",
            "prefix_hashes")


@dataclass(frozen=True)
class Turn:
    new_tokens: int                  # prompt tokens this turn adds to the conversation
    output_tokens: int
    think_time: float = 0.0          # s after the previous turn finished (turn 0: unused)
    client: Optional[str] = None     # None: the session id
    priority: int = 0
    ttft_slo: Optional[float] = None
    tpot_slo: Optional[float] = None
    max_tokens: Optional[int] = None
    # what a request of any trace may also ask for, kept when a turn becomes a request
    n: int = 1                       # parallel samples (copy-on-write forks)
    fork_output_tokens: tuple = ()
    beam_width: int = 1
    tool_calls: tuple = ()           # ToolCalls it pauses for
    spec_acceptance: Optional[float] = None


FEATURE_FIELDS = ("n", "fork_output_tokens", "beam_width", "tool_calls", "spec_acceptance")


@dataclass(frozen=True)
class Session:
    id: str
    start: float                     # s: turn 0's arrival
    turns: tuple                     # Turn, in order
    prefix_hashes: tuple = ()        # turn 0's shared prefix blocks (a system prompt)


def read_sessions(path: Path, name: str) -> list:
    """The sessions of a session-trace file, in start order (ties: file order)."""
    turns: dict = {}                 # session -> {turn: (line, record)}
    order: list = []
    for line, rec in F.json_records(path, name):
        for key in rec:
            if key not in REQUIRED + OPTIONAL:
                raise TraceError(name, line, key, f"unknown field; a session trace has {', '.join(REQUIRED + OPTIONAL)}")
        for key in REQUIRED:
            if key not in rec:
                raise TraceError(name, line, key, "missing (required)")
        sid = rec["session"]
        if isinstance(sid, bool) or not isinstance(sid, (str, int)) or sid == "":
            raise TraceError(name, line, "session", f"expected a session id (a string or an integer), got {sid!r}")
        sid = str(sid)
        k = rec["turn"]
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise TraceError(name, line, "turn", f"expected a turn index >= 0, got {k!r}")
        if sid not in turns:
            turns[sid] = {}
            order.append(sid)
        if k in turns[sid]:
            raise TraceError(name, line, "turn", f"turn {k} of session {sid} again (first on line {turns[sid][k][0]})")
        turns[sid][k] = (line, rec)
    sessions = [_session(sid, turns[sid], name) for sid in order]
    if not sessions:
        raise TraceError(name, None, None, "no sessions: the file has no turns")
    return sorted(sessions, key=lambda s: s.start)


def _session(sid: str, turns: dict, name: str) -> Session:
    if 0 not in turns:
        line = min(line for line, _ in turns.values())
        raise TraceError(name, line, "turn", f"session {sid} has no turn 0 (turn 0 carries its arrival_time)")
    missing = [k for k in range(max(turns) + 1) if k not in turns]
    if missing:
        raise TraceError(name, turns[max(turns)][0], "turn", f"session {sid} has turns up to {max(turns)} "
                         f"but no turn {missing[0]} (turns are 0, 1, 2, ... without gaps)")
    line0, first = turns[0]
    if "arrival_time" not in first:
        raise TraceError(name, line0, "arrival_time", f"missing on turn 0 of session {sid} (the session's start)")
    if "think_time" in first:
        raise TraceError(name, line0, "think_time", "turn 0 has no previous turn to think after; "
                         "give its arrival_time")
    out, thought = [], 0.0
    for k in range(len(turns)):
        line, rec = turns[k]
        if k and "arrival_time" in rec:
            raise TraceError(name, line, "arrival_time", f"only turn 0 has one: turn {k} arrives its "
                             f"think_time after turn {k - 1} finished")
        if k and "prefix_hashes" in rec:
            raise TraceError(name, line, "prefix_hashes", "only turn 0 has them: later turns extend the "
                             "conversation, whose prefix is the earlier turns")
        think = F.seconds(rec.get("think_time", 0.0), name, line, "think_time")
        thought += think
        if thought > F.MAX_SECONDS:      # (each turn arrives at least the sum of the think times after the start)
            raise TraceError(name, line, "think_time", f"session {sid}'s think times add up to {thought:.3g} s by "
                             f"turn {k}: its turns would arrive more than {F.MAX_SECONDS:.0e} s after its start")
        max_tokens = rec.get("max_tokens")
        out.append(Turn(F.positive_int(rec["new_tokens"], name, line, "new_tokens"),
                        F.positive_int(rec["output_tokens"], name, line, "output_tokens"), float(think),
                        None if rec.get("client") is None else F.text(rec["client"], name, line, "client"),
                        F.integer(rec.get("priority", 0), name, line, "priority"),
                        F.optional_seconds(rec.get("ttft_slo"), name, line, "ttft_slo"),
                        F.optional_seconds(rec.get("tpot_slo"), name, line, "tpot_slo"),
                        None if max_tokens is None else F.positive_int(max_tokens, name, line, "max_tokens")))
    return Session(sid, F.arrival(first["arrival_time"], name, line0, "arrival_time"), tuple(out),
                   F.block_ids(first.get("prefix_hashes", []), name, line0, "prefix_hashes"))


def write_sessions(path, sessions: Iterable[Session]) -> int:
    """Write sessions as a session trace (one line per turn); returns the turns written."""
    path, n = Path(path), 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for s in sessions:
            for k, t in enumerate(s.turns):
                rec = {"session": s.id, "turn": k}
                rec.update({"arrival_time": s.start} if k == 0 else {"think_time": t.think_time})
                rec.update(new_tokens=t.new_tokens, output_tokens=t.output_tokens)
                for key in ("client", "ttft_slo", "tpot_slo", "max_tokens"):
                    if getattr(t, key) is not None:
                        rec[key] = getattr(t, key)
                if t.priority:
                    rec["priority"] = t.priority
                if k == 0 and s.prefix_hashes:
                    rec["prefix_hashes"] = list(s.prefix_hashes)
                f.write(json.dumps(rec) + "\n")
                n += 1
    return n


def one_turn_sessions(trace: list) -> list:
    """An open-loop trace as sessions of one turn each (what `trace.concurrency` users send)."""
    return [Session(str(i), t.arrival_time, (Turn(t.prompt_tokens, t.output_tokens, 0.0, t.client, t.priority,
                                                   t.ttft_slo, t.tpot_slo, t.max_tokens,
                                                   **{k: getattr(t, k) for k in FEATURE_FIELDS}),), t.prefix_hashes)
            for i, t in enumerate(trace)]


def plan_of(sessions: list, concurrency: Optional[int] = None, user_gap: float = 0.0,
            paced: bool = False) -> SessionPlan:
    """The closed-loop plan of `sessions` (start order kept): one placeholder TraceRequest per
    turn, all of a session's at its start time (so the engines' arrival sort keeps this order);
    `user_gap` and `paced` as SessionPlan has them."""
    trace, session, turn, think, new = [], [], [], [], []
    sessions = sorted(sessions, key=lambda s: s.start)
    for s in sessions:
        context = 0
        for k, t in enumerate(s.turns):
            prompt = context + t.new_tokens
            trace.append(TraceRequest(s.start, prompt, t.output_tokens, t.client or s.id, t.priority, t.ttft_slo,
                                      t.tpot_slo, s.prefix_hashes if k == 0 else (), t.max_tokens,
                                      **{f: getattr(t, f) for f in FEATURE_FIELDS}))
            session.append(s.id)
            turn.append(k)
            think.append(t.think_time if k else 0.0)
            new.append(t.new_tokens)
            context = prompt + t.output_tokens
    return SessionPlan(trace, session, turn, think, new, concurrency, user_gap, paced)


def clip_sessions(sessions: list, max_new: Optional[int], max_output: Optional[int]) -> tuple:
    """Sessions with each turn's new and output tokens clipped: (sessions, turns clipped of each)."""
    clipped = [0, 0]

    def clip(t: Turn) -> Turn:
        new = t.new_tokens if max_new is None else min(t.new_tokens, max_new)
        out = t.output_tokens if max_output is None else min(t.output_tokens, max_output)
        clipped[0] += new < t.new_tokens
        clipped[1] += out < t.output_tokens
        return replace(t, new_tokens=new, output_tokens=out, tool_calls=clip_tool_calls(t.tool_calls, out))
    if max_new is None and max_output is None:
        return sessions, (0, 0)
    out = [replace(s, turns=tuple(clip(t) for t in s.turns)) for s in sessions]
    return out, tuple(clipped)
