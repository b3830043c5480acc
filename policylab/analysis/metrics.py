"""Per-request and aggregate metrics of a replay, exactly as DESIGN §6 defines them.

`request_table` turns a `RunResult` into one row per trace request; `summarize` reduces it
to a JSON-ready dict (NaN → None); `flatten` gives loggers `{"ttft/p99": ...}`. Times are
seconds on the replay clock, measured from each request's trace arrival time.
"""
from __future__ import annotations

import math
from itertools import chain
from typing import NamedTuple

import numpy as np
import pandas as pd

from policylab.analysis.program_metrics import add_program_columns, less_tool_time
from policylab.core.config import FairnessConfig, SloConfig
from policylab.core.result import STEP_FIELDS, RunResult
from policylab.analysis import counted as counted_values
from policylab.analysis.client_fairness import client_fairness
from policylab.analysis.qoe import request_qoe
from policylab.core.config import QoeConfig
from policylab.analysis.cluster_metrics import add_placement, cluster_summary, replica_blocks_per_step
from policylab.analysis.session_metrics import add_sessions
from policylab.analysis.sections import SectionContext, feature_sections
from policylab.cluster.result import ClusterResult
from policylab.core.request import Status

QUANTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p99.9": 99.9}
LATENCIES = ("ttft", "tpot", "e2e", "normalized_latency", "queueing_delay")
MAX_LISTED_REJECTIONS = 10
NAN = float("nan")


def request_table(result: RunResult, slo: SloConfig, start: int = 0, stop: int | None = None) -> pd.DataFrame:
    """One row per trace request with req_id in [start, stop) (all by default), including those
    that never arrived; a results writer builds the table in such slices as the run goes.

    TTFT and queueing delay are filled wherever the timestamp exists; E2E, TPOT and normalized
    latency only for finished requests (TPOT also needs ≥ 2 output tokens). `slo_met` is
    False for anything not finished; a request with ≤ 1 output token meets TPOT by definition.
    `token_times` holds each Request's own list (not a copy: 20k × 200 copies cost seconds of GC).
    """
    stop = len(result.trace) if stop is None else stop
    rows = [_request_row(t, r) for t, r in zip(result.trace[start:stop], result.requests[start:stop])]
    df = pd.DataFrame(rows, columns=["client", "priority", "arrival_time", "prompt_tokens",
                                     "output_tokens", "generated_tokens", "status", "reason",
                                     "first_scheduled_time", "first_token_time", "finish_time",
                                     "preemptions", "cached_tokens", "ttft_slo", "tpot_slo",
                                     "token_times"])
    df = df.astype({"client": str, "priority": np.int64, "arrival_time": np.float64,
                    "prompt_tokens": np.int64, "output_tokens": np.int64,
                    "generated_tokens": np.int64, "status": str, "reason": str,
                    "first_scheduled_time": np.float64, "first_token_time": np.float64,
                    "finish_time": np.float64, "preemptions": np.int64,
                    "cached_tokens": np.int64, "ttft_slo": np.float64, "tpot_slo": np.float64})
    df.insert(0, "req_id", np.arange(start, start + len(df), dtype=np.int64))
    df["ttft_slo"] = df["ttft_slo"].fillna(slo.ttft)
    df["tpot_slo"] = df["tpot_slo"].fillna(slo.tpot)
    finished = (df["status"] == "finished").to_numpy()
    arrival, generated = df["arrival_time"].to_numpy(), df["generated_tokens"].to_numpy()
    ttft = df["first_token_time"].to_numpy() - arrival
    e2e = np.where(finished, df["finish_time"].to_numpy() - arrival, NAN)
    with np.errstate(divide="ignore", invalid="ignore"):
        decode_end = e2e if not result.sections.get("forks") else \
            np.where(finished, _last_token_times(df["token_times"]) - arrival, NAN)   # its own stream's end
        tpot = np.where(generated > 1, (decode_end - ttft) / (generated - 1), NAN)
        normalized = e2e / generated
    df["ttft"], df["tpot"], df["e2e"], df["normalized_latency"] = ttft, tpot, e2e, normalized
    df["queueing_delay"] = df["first_scheduled_time"].to_numpy() - arrival
    df["slo_met"] = finished & (ttft <= df["ttft_slo"].to_numpy()) & (
        (generated <= 1) | (tpot <= df["tpot_slo"].to_numpy()))
    table = add_sessions(add_placement(df[["req_id", "client", "priority", "arrival_time", "prompt_tokens", "output_tokens",
                                           "generated_tokens", "status", "reason", "first_scheduled_time",
                                           "first_token_time", "finish_time", *LATENCIES, "preemptions", "cached_tokens",
                                           "ttft_slo", "tpot_slo", "slo_met", "token_times"]], result, start, stop),
                         result, start, stop)
    if result.sections.get("tool_calls") is not None:      # tool calls: tool time is not serving time
        add_program_columns(table, result, start, stop)
    return table


def add_qoe(table: pd.DataFrame, flat: tuple, qoe: QoeConfig) -> None:
    """Give a request table its `qoe` column (in place; `flat`: its `flat_token_times`)."""
    table["qoe"] = request_qoe(flat[0], flat[1], table["arrival_time"].to_numpy(), table["status"].to_numpy(), qoe)


def _request_row(t, r) -> tuple:
    slos = (NAN if t.ttft_slo is None else t.ttft_slo, NAN if t.tpot_slo is None else t.tpot_slo)
    static = (t.client, t.priority, t.arrival_time, t.prompt_tokens, t.output_tokens)
    if r is None:
        return (*static, 0, "unfinished", "never arrived (run stopped)", NAN, NAN, NAN, 0, 0,
                *slos, [])
    if r.status is Status.FINISHED or r.status is Status.REJECTED:
        status, reason = r.status.value, r.reject_reason
    else:
        status, reason = "unfinished", r.reject_reason or f"{r.status.value} when the run stopped"
    times = r.token_times
    return (*static, len(r.output_ids), status, reason, _or_nan(r.first_scheduled_time),
            times[0] if times else NAN, _or_nan(r.finish_time), r.num_preemptions,
            r.num_cached_tokens_total, *slos, times)


def _last_token_times(token_times) -> np.ndarray:
    """Each row's last output token's time (NaN without one): where a request with parallel
    samples ends its own stream, before its last sample finishes."""
    return np.fromiter((t[-1] if t else NAN for t in token_times), dtype=np.float64, count=len(token_times))


def _or_nan(x) -> float:
    return NAN if x is None else x


def step_table(result: RunResult) -> pd.DataFrame:
    """The engine's per-step columns plus a `step` index and `kv_utilization` (used / total)."""
    return step_frame(result.steps, 0, result)


def step_frame(raw: dict, start: int, result: RunResult) -> pd.DataFrame:
    """Steps `start`, `start + 1`, ... of `raw` (STEP_FIELDS -> values, rows of `result`) as a step table."""
    columns = {k: np.asarray(raw.get(k, []), dtype=np.float64 if k in ("clock", "duration") else np.int64)
               for k in STEP_FIELDS}
    df = pd.DataFrame({"step": np.arange(start, start + len(columns["clock"]), dtype=np.int64), **columns},
                      copy=False)                  # (no consolidated copy: a million requests' steps are 0.3 GB)
    blocks = replica_blocks_per_step(raw, result)      # a cluster: each row's own replica
    if blocks is not None:
        df["replica"] = np.asarray(raw["replica"], dtype=np.int64)
    df["kv_utilization"] = df["kv_used_blocks"] / (result.num_blocks if blocks is None else blocks) \
        if result.num_blocks else NAN
    return df


def distribution(values) -> dict:
    """mean, p50 … p99.9 (numpy linear percentiles) and max of the non-NaN values (an array, or
    a `counted.Counted`: the ITL gaps, exact without holding each one)."""
    if isinstance(values, counted_values.Counted):
        if not values.size:
            return {"mean": None, **{k: None for k in QUANTILES}, "max": None}
        q = counted_values.percentiles(values, list(QUANTILES.values()))
        return {"mean": counted_values.mean(values), **dict(zip(QUANTILES, map(float, q))),
                "max": float(values.values[-1])}
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return {"mean": None, **{k: None for k in QUANTILES}, "max": None}
    mean, top = float(v.mean()), float(v.max())     # before the percentiles reorder `v` (a copy)
    q = np.percentile(v, list(QUANTILES.values()), overwrite_input=True)
    return {"mean": mean, **dict(zip(QUANTILES, map(float, q))), "max": top}


def flat_token_times(token_times) -> tuple[np.ndarray, np.ndarray]:
    """(every output token's time, its row) from a list column, in row then token order."""
    lengths = np.fromiter(map(len, token_times), dtype=np.int64, count=len(token_times))
    return flat_times(token_times, int(lengths.sum())), np.repeat(np.arange(len(lengths)), lengths)


def flat_times(token_times, count: int = -1) -> np.ndarray:
    """Every output token's time from a list column, in row then token order (`count`: how many)."""
    if len(token_times) and type(token_times[0]) is np.ndarray:      # read back from a results file: the
        return np.concatenate(token_times).astype(np.float64, copy=False)   # arrays whole, not token by token
    return np.fromiter(chain.from_iterable(token_times), dtype=np.float64, count=count)


class TokenFacts(NamedTuple):
    """What the summary needs of the output tokens, without keeping every token's time: the
    pooled ITL gaps as distinct values with counts (exact percentiles, see `counted`) and the
    service of output tokens as (time, client, tokens) events, tokens of one client at one
    time merged."""

    itl: counted_values.Counted
    service_time: np.ndarray
    service_client: np.ndarray
    service_tokens: np.ndarray


def token_facts(table: pd.DataFrame, flat: tuple | None = None, services: bool | None = None) -> TokenFacts:
    """TokenFacts of the requests of `table` (a request table with its `token_times` column;
    `flat`: that column's `flat_token_times`, if the caller has it already). `services`: whether
    to make the service events (default: when `table` holds more than one client). A run of one
    client has no service difference to measure, and they cost a sort of every token time."""
    token_time, token_row = flat or flat_token_times(table["token_times"].tolist())
    finished = (table["status"] == "finished").to_numpy()
    itl = less_tool_time(np.diff(token_time), token_row, table)[(token_row[1:] == token_row[:-1])
                                                                 & finished[token_row[1:]]]
    names, client = np.unique(table["client"].to_numpy(dtype=str), return_inverse=True)
    if not (names.size > 1 if services is None else services):
        return TokenFacts(counted_values.counted(itl), np.zeros(0), np.zeros(0, dtype=str), np.zeros(0))
    code = client.reshape(-1)[token_row]
    order = np.lexsort((code, token_time))
    time, code = token_time[order], code[order]
    first = np.concatenate([[True], (time[1:] != time[:-1]) | (code[1:] != code[:-1])]) if time.size else \
        np.zeros(0, dtype=bool)
    starts = np.flatnonzero(first)
    tokens = np.diff(np.append(starts, time.size)).astype(np.float64)
    return TokenFacts(counted_values.counted(itl), time[starts], names[code[starts]], tokens)


def summarize(requests_df: pd.DataFrame, steps_df: pd.DataFrame, result: RunResult,
              slo: SloConfig, fairness_cfg: FairnessConfig, facts: TokenFacts | None = None,
              qoe: QoeConfig | None = None) -> dict:
    """Aggregate metrics of one replay, JSON-ready.

    Latency distributions (TTFT, TPOT, ITL, E2E, …) are over *finished* requests, as in vLLM's
    benchmark. SLO attainment is over *all* trace requests: rejected and unfinished ones count
    as missing their SLO, so shedding load never raises it. Goodput = requests meeting their
    SLOs / makespan, the denominator of every throughput (DESIGN §6), so goodput ≤ requests/s.
    The makespan runs from the first arrival to the last completion, rejection or step end
    (whichever is last).
    `facts` are the table's TokenFacts (taken from its `token_times` column when not given).
    QoE (`policylab.analysis.qoe`) is summarized when the table has its `qoe` column (`add_qoe`):
    over finished requests, a rejected one counting 0.
    """
    df = requests_df
    facts = token_facts(df) if facts is None else facts
    status = df["status"].to_numpy()
    finished = status == "finished"
    arrival = df["arrival_time"].to_numpy()
    step_end = (steps_df["clock"] + steps_df["duration"]).to_numpy()
    end = _nanmax(np.concatenate([df["finish_time"].to_numpy(), step_end]))
    start = arrival.min() if arrival.size else NAN
    makespan = end - start
    trace_duration = arrival.max() - start if arrival.size else NAN
    if not trace_duration > 0:
        trace_duration = makespan
    prefilled = ~np.isnan(df["first_token_time"].to_numpy())
    scheduled = ~np.isnan(df["first_scheduled_time"].to_numpy())
    kv = steps_df["kv_utilization"].to_numpy()
    rejected = df[status == "rejected"].head(MAX_LISTED_REJECTIONS)
    summary = {
        "status": result.status, "partial": result.partial, "error": result.error,
        "policy": result.policy,
        "counts": {"requests": len(df), "finished": int(finished.sum()),
                   "rejected": int((status == "rejected").sum()),
                   "unfinished": int((status == "unfinished").sum())},
        "trace_duration": trace_duration, "makespan": makespan,
        **{name: distribution(df[name].to_numpy()[finished]) for name in LATENCIES},
        "itl": distribution(facts.itl),
        "slo": {"ttft": slo.ttft, "tpot": slo.tpot},
        "slo_attainment": df["slo_met"].mean() if len(df) else NAN,
        "goodput": _rate(df["slo_met"].sum(), makespan),
        "throughput": {
            "output_tokens_per_s": _rate(df["generated_tokens"].sum(), makespan),
            "input_tokens_per_s": _rate(df["prompt_tokens"].to_numpy()[prefilled].sum(), makespan),
            "requests_per_s": _rate(finished.sum(), makespan)},
        "preemptions": int(df["preemptions"].sum()),
        "prefix_cache_hit_rate": _rate(df["cached_tokens"].to_numpy()[scheduled].sum(),
                                       df["prompt_tokens"].to_numpy()[scheduled].sum()),
        "kv_utilization": {"mean": kv.mean() if kv.size else NAN, "max": _nanmax(kv)},
        **_fairness(client_fairness(df, facts, fairness_cfg, end)),
        "rejections": [{"req_id": int(i), "client": c, "reason": why} for i, c, why in
                       zip(rejected["req_id"], rejected["client"], rejected["reason"])],
    }
    if "qoe" in df.columns:
        qoe = qoe or QoeConfig()
        summary["qoe"] = distribution(df["qoe"].to_numpy())
        summary["qoe_expected"] = {"ttft": qoe.ttft, "tds": qoe.tds}
    summary.update(feature_sections(SectionContext(result, df, summary, distribution)))   # (each extension's)
    if isinstance(result, ClusterResult):
        summary["router"] = result.router
        summary["cluster"] = cluster_summary(df, steps_df, result, makespan, summary["goodput"], distribution)
    return json_safe(summary)


def _fairness(whole_run: dict) -> dict:
    """"fairness" (whole run) and "fairness_windows" (`policylab.analysis.fairness_windows`)."""
    windows = whole_run.pop("windows")
    return {"fairness": whole_run, "fairness_windows": windows}


def _rate(amount, seconds) -> float:
    return float(amount) / seconds if seconds > 0 else NAN


def _nanmax(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(x.max()) if x.size else NAN


def json_safe(obj):
    """Plain Python containers and scalars; NaN and ±inf become None (JSON has no NaN)."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    return obj


def flatten(summary: dict, prefix: str = "") -> dict:
    """`{"ttft": {"p99": x}}` → `{"ttft/p99": x}` for loggers; lists (rejections) are left out."""
    flat = {}
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}/"))
        elif not isinstance(value, list):
            flat[name] = value
    return flat
