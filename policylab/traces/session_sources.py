"""Sessions recovered from public open-loop traces that record conversations.

- BurstGPT releases with a `Session ID` column: the rows of one id are the turns of one
  conversation, in timestamp order (an empty id: a conversation of one turn).
- Mooncake conversation traces: a request whose `hash_ids` extend an earlier request's whole
  prompt (all its blocks, or all but its last, partial one) is that conversation's next turn;
  Mooncake's ids are prefix hashes, so an equal id at a position means an equal prefix.

Both record when each request was sent, not when the previous answer ended: a turn's think
time is the gap between the two recorded sends, which also holds the recorded service time
(an upper bound on the user's think time). A turn's new tokens are its prompt minus the
previous prompt and output when the recorded prompt holds the history (it is at least as long),
else its whole prompt.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Optional, Sequence, Union

from policylab.traces.csv_formats import burstgpt_rows
from policylab.traces.mooncake import read_mooncake
from policylab.traces.sessions import Session, Turn

SESSION_COLUMN = "Session ID"


def turns_of(requests: list) -> tuple:
    """Turns of one conversation from its requests (arrival order): RawRequest-like rows."""
    turns, previous = [], None
    for r in requests:
        if previous is None:
            new, think = r.prompt_tokens, 0.0
        else:
            history = previous.prompt_tokens + previous.output_tokens
            new = r.prompt_tokens - history if r.prompt_tokens > history else r.prompt_tokens
            think = max(0.0, r.arrival_time - previous.arrival_time)
        turns.append(Turn(new, r.output_tokens, think, None if r.client == "default" else r.client,
                          r.priority, r.ttft_slo, r.tpot_slo, r.max_tokens))
        previous = r
    return tuple(turns)


def grouped_sessions(groups: dict) -> list:
    """Sessions from {session id: requests in arrival order}."""
    return [Session(sid, reqs[0].arrival_time, turns_of(reqs), reqs[0].prefix_hashes) for sid, reqs in groups.items()]


def read_burstgpt_sessions(path: Path, name: str, skipped: Counter,
                           model: Union[str, Sequence[str], None] = None,
                           log_type: Optional[str] = None) -> list:
    """BurstGPT rows grouped by their `Session ID` (the column must be there)."""
    from policylab.traces.raw import RawRequest
    groups: dict = {}
    for line, t, prompt, response, sid in burstgpt_rows(path, name, skipped, SESSION_COLUMN, model, log_type):
        if prompt == 0:
            skipped["Request tokens <= 0"] += 1
            continue
        groups.setdefault(sid or f"row-{line}", []).append(RawRequest(t, prompt, response))
    for reqs in groups.values():
        reqs.sort(key=lambda r: r.arrival_time)
    return grouped_sessions(groups)


def read_mooncake_sessions(path: Path, name: str, skipped: Counter) -> list:
    """Mooncake requests chained into conversations by their hash ids."""
    reqs = sorted(read_mooncake(path, name, skipped), key=lambda r: r.arrival_time)
    groups: dict = {}
    open_ends: dict = {}             # a block id -> (session, its request's position in it, hash count)
    for n, r in enumerate(reqs):
        hashes, found = r.prefix_hashes, None
        for k in range(len(hashes) - 1, 0, -1):       # the longest earlier prompt it extends
            end = open_ends.get(hashes[k - 1])
            if end is not None and k >= end[1] - 1 and k < len(hashes):
                found = end
                break
        sid = found[0] if found else f"conversation-{n}"
        if found:
            for key in found[2]:
                open_ends.pop(key, None)               # a conversation goes on from its latest turn only
        groups.setdefault(sid, []).append(r)
        keys = tuple(hashes[-2:]) if hashes else ()
        for key in keys:
            open_ends[key] = (sid, len(hashes), keys)
    return grouped_sessions(groups)
