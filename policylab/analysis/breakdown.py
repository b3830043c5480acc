"""Per-SLO-class and per-client tables of compared runs, from each run's requests.parquet.

A trace may give each request its own SLOs (the interactive and batch classes of
`multitenant`); a run's single attainment number hides which class pays for a policy's
choices. Attainment and percentiles follow DESIGN §6 (SLOs per request; latency percentiles
over finished requests). A class is named by its SLO pair (`TTFT≤0.5s TPOT≤50ms`), as requests.parquet
stores the pair, not the trace's class name. Replicates are pooled as in `compare_stats`.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from policylab.analysis.compare_stats import CELL, aggregate
from policylab.analysis.run_table import IDENTITY, read_requests_file

COLUMNS = ["client", "status", "ttft", "tpot", "ttft_slo", "tpot_slo", "slo_met"]
BREAKDOWN_METRICS = ["requests", "SLO attainment (%)", "TTFT p99 (ms)", "TPOT p99 (ms)"]
KINDS = {"SLO class": "slo_class", "client": "client"}


def slo_class(ttft_slo, tpot_slo) -> str:
    return f"TTFT≤{ttft_slo:g}s TPOT≤{tpot_slo * 1e3:g}ms"


def _p99_ms(values: pd.Series) -> float:
    values = values.dropna()
    return float(np.percentile(values, 99)) * 1e3 if len(values) else np.nan


def run_breakdown(requests: pd.DataFrame, by: str) -> pd.DataFrame:
    """requests, SLO attainment (%), TTFT and TPOT p99 (ms, finished requests) per value of `by`."""
    finished = requests[requests["status"] == "finished"]
    grouped, done = requests.groupby(by, sort=True), finished.groupby(by, sort=True)
    out = pd.DataFrame({"requests": grouped.size(), "SLO attainment (%)": grouped["slo_met"].mean() * 100})
    out["TTFT p99 (ms)"] = done["ttft"].agg(_p99_ms)
    out["TPOT p99 (ms)"] = done["tpot"].agg(_p99_ms)
    return out.rename_axis("group").reset_index()


def breakdowns(runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """'SLO class' and 'client' → replicates pooled per (trace, load, label, group), with CIs."""
    parts = {kind: [] for kind in KINDS}
    for run in runs[IDENTITY].itertuples(index=False):
        path = Path(run.run_dir) / "requests.parquet"
        if not path.exists():
            print(f"note: {path} missing, {run.label} left out of the per-class tables", file=sys.stderr)
            continue
        requests = read_requests_file(path, lambda p: pd.read_parquet(p, columns=COLUMNS))
        requests["slo_class"] = [slo_class(a, b) for a, b in zip(requests["ttft_slo"], requests["tpot_slo"])]
        for kind, column in KINDS.items():
            table = run_breakdown(requests, column)
            table[["trace", "load", "label"]] = run.trace, run.load, run.label
            parts[kind].append(table)
    out = {}
    for kind, tables in parts.items():
        if tables:
            pooled = pd.concat(tables, ignore_index=True)
            pooled["label"] = pooled["label"] + " | " + pooled["group"].astype(str)
            agg = aggregate(pooled, BREAKDOWN_METRICS).drop(columns=["requests ±", "requests low", "requests high"])
            agg[["label", "group"]] = agg["label"].str.rsplit(" | ", n=1, expand=True)
            out[kind] = agg[[*CELL, "group", "n", *(c for c in agg.columns if c not in (*CELL, "group", "n"))]]
    return out
