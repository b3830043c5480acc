"""Replicates pooled into means with 95% confidence intervals, and honest "best" marks.

Runs that share trace, load and configuration are replicates (`run_table`). Each metric is
reported as the replicates' mean with a two-sided 95% Student-t interval
(mean ± t(0.975, n−1) · s / √n; none with one replicate). A configuration is marked best
only against the others at the same trace and load, and the mark says whether its interval
overlaps another configuration's: then the ranking is within noise. The metrics pooled are
a run's DESIGN §6 aggregates; pooling replicates is the "same seed → same result" of
DESIGN §8 turned around: only a replicate that changes the input (`trace.replicate`) adds
information.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from policylab.analysis.run_table import COLUMNS, METRICS

GROUP = ["trace", "load"]                 # runs comparable with each other
CELL = [*GROUP, "label"]                  # one configuration at one trace and load
CONFIDENCE = 0.95
CI_NOTE = "mean ± 95% CI (Student t over replicates)"
LIGHT_KV = 50.0                           # KV peak (%) below which the cache is never a constraint
LIGHT_QUEUE = 0.1                         # p99 queueing below this share of the TTFT SLO: no queueing


def ci_half_width(values) -> float:
    """Half-width of the 95% Student-t interval of the mean (NaN below two finite values)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size < 2:
        return math.nan
    from scipy import stats        # (slow to import: only a comparison with replicates needs it)
    return float(stats.t.ppf(0.5 + CONFIDENCE / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))


def aggregate(df: pd.DataFrame, metrics=METRICS) -> pd.DataFrame:
    """One row per (trace, load, label): `n`, `rate` and per metric `<m>` (mean) and `<m> ±` (CI)."""
    grouped = df.groupby(CELL, sort=False)
    out = grouped[list(metrics)].mean()
    for m in metrics:
        out[f"{m} ±"] = grouped[m].agg(ci_half_width)
    out.insert(0, "n", grouped.size())
    if "partial" in df:
        out["partial"] = grouped["partial"].any()
    if "rate" in df:
        out.insert(1, "rate", grouped["rate"].mean())
    out = out.reset_index()
    return out.sort_values(GROUP, kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class Mark:
    """A best cell: `overlaps` names the configurations whose interval reaches the best's."""
    overlaps: tuple = ()
    has_ci: bool = True

    @property
    def within_noise(self) -> bool:
        return bool(self.overlaps) or not self.has_ci


def _interval(row, m: str) -> tuple[float, float]:
    half = row[f"{m} ±"]
    return (row[m] - half, row[m] + half) if np.isfinite(half) else (row[m], row[m])


def best_marks(agg: pd.DataFrame) -> dict:
    """(row index, metric) → Mark, for each metric's best mean within each trace-and-load group
    (rounded to the shown digits, so ties are all marked); groups of one configuration and
    metrics equal across the group get no mark. Partial runs are never ranked: a run that
    stopped early measured only the requests that ended, which look fast."""
    marks = {}
    for _, group in agg.groupby(GROUP, sort=False):
        if "partial" in group:
            group = group[~group["partial"].astype(bool)]
        if len(group) < 2:
            continue
        for c in (c for c in COLUMNS if c.better):
            values = group[c.label].round(c.digits)
            if values.nunique(dropna=True) < 2:
                continue
            target = values.min() if c.better == "min" else values.max()
            for i in group.index[values == target]:
                lo, hi = _interval(group.loc[i], c.label)
                overlaps = tuple(group.loc[j, "label"] for j in group.index if j != i
                                 and values[j] != target and _overlap((lo, hi), _interval(group.loc[j], c.label)))
                marks[(i, c.label)] = Mark(overlaps, bool(np.isfinite(group.loc[i, f"{c.label} ±"])))
    return marks


def _overlap(a: tuple, b: tuple) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def findings(df: pd.DataFrame, agg: pd.DataFrame, marks: dict) -> list[str]:
    """Warnings that make a comparison uninformative, one sentence each."""
    notes = []
    if "partial" in df:
        for run in df[df["partial"].astype(bool)].itertuples(index=False):
            why = f"; {run.error}" if run.error else ""
            notes.append(f"{run.label} on {run.trace} at load ×{run.load:g} ({run.run_dir}) is a partial run "
                         f"({run.finished} requests finished{why}): shown, never ranked against complete runs")
    for (trace, load, label), cell in df.groupby(CELL, sort=False):
        if len(cell) > 1 and (cell[METRICS].nunique(dropna=False) <= 1).all():
            notes.append(f"{label} on {trace} at load ×{load:g}: its {len(cell)} replicates gave identical "
                         "results: the seed does not vary a sim replay of a trace file; use "
                         "trace.replicate=1,2,3 for replicates")
    for (trace, load), group in agg.groupby(GROUP, sort=False):
        where = f"{trace} at load ×{load:g}"
        if len(group) > 1 and group["n"].min() > 1:
            decided = [k for k, mark in marks.items() if k[0] in group.index and not mark.within_noise]
            if not decided:
                notes.append(f"{where}: every configuration is within noise of the best on every metric "
                             "(95% intervals overlap): this comparison does not rank them")
        runs = df[(df["trace"] == trace) & (df["load"] == load)]
        light = light_load(runs["KV peak (%)"].max(), runs["queueing p99 (s)"].max(), runs["ttft_slo"].max())
        if light:
            notes.append(f"{where}: {light}")
    return notes


def light_load(kv_peak_pct, queueing_p99, ttft_slo) -> str | None:
    """Why a replay was too light for policies to differ (None when it was not)."""
    try:
        kv_peak_pct, queueing_p99 = float(kv_peak_pct), float(queueing_p99)
    except (TypeError, ValueError):           # no step ran, no request scheduled
        return None
    if not (np.isfinite(kv_peak_pct) and np.isfinite(queueing_p99)) or not ttft_slo:
        return None
    if kv_peak_pct < LIGHT_KV and queueing_p99 < LIGHT_QUEUE * ttft_slo:
        return (f"light load: KV peaked at {kv_peak_pct:.0f}% and p99 queueing was {queueing_p99 * 1e3:.0f} ms "
                f"(< {LIGHT_QUEUE:.0%} of the {ttft_slo:g} s TTFT SLO): scheduling policies barely differ "
                "here; raise trace.rate_scale (or lower engine.num_blocks)")
    return None
