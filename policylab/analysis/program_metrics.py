"""Metrics of programs: requests that pause for tool calls (policylab.core.extensions.tool_calls).

A tool's time is the program's, not the server's. So in a run with tool calls:

  jct        job completion time: finish − arrival, the tools' time included (what the
             agent's user waits for)
  tool_time  seconds the request was paused: the sum of its tools' durations (a call
             pauses at the step that gave its token and the tool returns exactly
             `duration_s` later; waiting to be scheduled again after that is serving time)
  e2e        finish − arrival − tool_time (serving time only)
  TTFT       unchanged: a call comes after at least one output token
  TPOT       (e2e − TTFT) / (output tokens − 1), e2e as above
  ITL        every gap between consecutive output tokens, less the tool's duration for the
             gap a call falls in (its resume latency stays: recompute, swap-in, queueing)
  output tokens (generated_tokens) count the model's tokens, not the tool's.

`recomputed_tokens` are the computed tokens a request lost when its KV was freed at a call
(or kept KV was freed because the policy left it idle) that the prefix cache did not give
back when it restarted.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

NAN = float("nan")
RUN_COUNTERS = ("tool_calls", "kept", "freed", "offloaded", "offload_fallbacks", "kept_released",
                "recomputed_tokens", "offloaded_blocks", "paused_time")


def add_program_columns(df: pd.DataFrame, result, start: int, stop: int) -> None:
    """Give a request table (rows start..stop of `result`) its program columns and make its
    latencies exclude tool time (in place; the columns the request table already has)."""
    tools = result.sections["tool_calls"]
    per, tokens = tools.per_request, tools.tool_tokens
    rows = range(start, stop)
    calls = np.array([per.get(i, (0,))[0] for i in rows], dtype=np.int64)
    paused = np.array([per.get(i, (0, 0.0))[1] for i in rows], dtype=np.float64)
    recomputed = np.array([per.get(i, (0, 0.0, 0))[2] for i in rows], dtype=np.int64)
    tool_tokens = np.array([tokens.get(i, 0) for i in rows], dtype=np.int64)
    finished = (df["status"] == "finished").to_numpy()
    arrival = df["arrival_time"].to_numpy()
    jct = np.where(finished, df["finish_time"].to_numpy() - arrival, NAN)
    generated = df["generated_tokens"].to_numpy() - tool_tokens
    e2e = jct - paused
    ttft = df["ttft"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(generated > 1, (e2e - ttft) / (generated - 1), NAN)
        normalized = e2e / generated
    df["generated_tokens"], df["e2e"], df["tpot"], df["normalized_latency"] = generated, e2e, tpot, normalized
    df["slo_met"] = finished & (ttft <= df["ttft_slo"].to_numpy()) & (
        (generated <= 1) | (tpot <= df["tpot_slo"].to_numpy()))
    df["tool_calls"], df["tool_time"], df["jct"], df["recomputed_tokens"] = calls, paused, jct, recomputed
    df["tool_gaps"] = [[(c.after_tokens - 1, c.duration_s) for c in result.trace[i].tool_calls[:n]]
                       for i, n in zip(rows, calls)]


def less_tool_time(gaps: np.ndarray, token_row: np.ndarray, table: pd.DataFrame) -> np.ndarray:
    """`gaps` (np.diff of the flat token times, `token_row` their rows) less each tool call's
    duration in the gap it falls in."""
    if "tool_gaps" not in table.columns or not gaps.size:
        return gaps
    gaps = gaps.copy()
    first = np.searchsorted(token_row, np.arange(len(table)))     # each row's first token
    count = np.bincount(token_row, minlength=len(table))
    for row, pauses in enumerate(table["tool_gaps"]):
        for index, seconds in pauses:
            if index < count[row] - 1:                  # (a call the request went past)
                gaps[first[row] + index] -= seconds
    return gaps


def program_summary(df: pd.DataFrame, result, distribution) -> dict:
    """The summary's `programs` section: JCT and pause time per request, the run's counters."""
    finished = (df["status"] == "finished").to_numpy()
    called = finished & (df["tool_calls"].to_numpy() > 0)
    stats = result.sections["tool_calls"].stats
    return {"jct": distribution(df["jct"].to_numpy()[finished]),
            "tool_time": distribution(df["tool_time"].to_numpy()[called]),
            "programs_with_calls": int(called.sum()),
            **{k: stats[k] for k in RUN_COUNTERS}}
