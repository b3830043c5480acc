"""Per-session and per-turn figures of a closed-loop replay (docs/sessions.md).

- per request: its `session` and `turn` (columns of requests.parquet);
- per session: completion time = its last turn's finish − its first turn's arrival, over the
  sessions whose every turn finished (a session with a rejected turn did not complete);
- per turn index: TTFT of the finished turns with that index (turn 0 pays the whole prompt,
  later turns only what the prefix cache does not hold), up to MAX_TURNS_LISTED indices.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

MAX_TURNS_LISTED = 16


def add_sessions(requests: pd.DataFrame, result, start: int = 0, stop: int | None = None) -> pd.DataFrame:
    """The request table (rows `start`..`stop`) plus each request's session and turn, for a
    closed-loop replay (`result.sessions`, a SessionPlan); unchanged otherwise."""
    plan = result.sections.get("sessions")
    if plan is None:
        return requests
    return requests.assign(session=np.asarray(plan.session[start:stop], dtype=object).astype(str),
                           turn=np.asarray(plan.turn[start:stop], dtype=np.int64))


def session_summary(requests: pd.DataFrame, plan, distribution: Callable) -> dict:
    """The summary's `sessions` block."""
    df = requests[["session", "turn", "status", "arrival_time", "finish_time", "ttft"]]
    by = df.groupby("session", sort=False)
    completed = by["status"].agg(lambda s: bool((s == "finished").all()))
    span = by["finish_time"].max() - by["arrival_time"].min()
    finished = df[df["status"] == "finished"]
    by_turn = {str(k): distribution(g.to_numpy()) for k, g in finished.groupby("turn")["ttft"]
               if k < MAX_TURNS_LISTED}
    turns = by.size().to_numpy()
    return {"mode": plan.mode, "users": plan.concurrency,
            "count": int(len(completed)), "completed": int(completed.sum()),
            "turns_mean": float(turns.mean()) if turns.size else float("nan"),
            "completion_time": distribution(span[completed].to_numpy()),
            "ttft_by_turn": by_turn}
