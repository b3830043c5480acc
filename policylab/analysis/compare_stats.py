"""Replicates pooled into means with 95 % intervals inside each metric's limits, and rankings
decided by pairwise tests.

Runs that share trace, load and configuration are replicates (`run_table`). Each metric is
reported as the replicates' mean with its 95 % interval (`intervals`: Wilson's for proportions,
Student's t cut at the metric's limits otherwise). Within each trace and load the complete
configurations are ranked on every metric the catalog gives a direction, into tiers: walking
down from the best mean, a configuration starts a new tier only when the pairwise test
(`intervals.difference`: paired differences where the replicates share their seeds, a bootstrap
otherwise) separates it from the best of the tier above, by at least the shown precision. A
tie at the top therefore never hides a configuration that is clearly worse. Partial runs are
never ranked: a run that stopped early measured only the requests that ended, which look fast.
Pooling replicates is the "same seed → same result" of DESIGN §8 turned around: only a
replicate that changes the input (`trace.replicate`) adds information.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from policylab.analysis.intervals import Difference, difference, mean_interval
from policylab.analysis.run_table import COLUMNS, METRICS

GROUP = ["trace", "load"]                 # runs comparable with each other
CELL = [*GROUP, "label"]                  # one configuration at one trace and load
CI_NOTE = "mean ± 95% interval over replicates"
INTERVAL_NOTE = ("95% intervals of the replicates' mean: Student t, cut at the metric's limits (nothing "
                 "below 0, no share above 100%); shares (%) get Wilson's score interval with the replicates' "
                 "effective size, shown as [low–high]. With 3 replicates t(0.975, 2) = 4.30: intervals are wide.")
SHOWN = {c.label: c for c in COLUMNS}


def interval_of(metric: str) -> tuple:
    """(limits in the shown unit, whether it is a proportion) of a compare column."""
    c = SHOWN.get(metric)
    return (c.limits, c.proportion) if c is not None else ((0.0, math.inf), False)


def aggregate(df: pd.DataFrame, metrics=METRICS) -> pd.DataFrame:
    """One row per (trace, load, label): `n`, `rate` and per metric `<m>` (the replicates' mean),
    `<m> low` and `<m> high` (its 95 % interval) and `<m> ±` (half the interval's width)."""
    grouped = df.groupby(CELL, sort=False)
    means = grouped[list(metrics)].mean()
    columns = {}
    for m in metrics:
        limits, proportion = interval_of(m)
        bounds = grouped[m].agg(lambda v: mean_interval(v, limits, proportion))
        low = np.array([b[0] for b in bounds], dtype=float)
        high = np.array([b[1] for b in bounds], dtype=float)
        columns.update({m: means[m], f"{m} ±": (high - low) / 2, f"{m} low": low, f"{m} high": high})
    out = pd.DataFrame(columns, index=means.index)
    out.insert(0, "n", grouped.size())
    if "partial" in df:
        out["partial"] = grouped["partial"].any()
    if "rate" in df:
        out.insert(1, "rate", grouped["rate"].mean())
    if "capacity_load" in df:
        out["capacity_load"] = grouped["capacity_load"].mean()
    out = out.reset_index()
    return out.sort_values(GROUP, kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class Ranking:
    """One metric at one trace and load: tiers of configurations, the best tier first (each in
    order of its mean), and the difference that separates each tier's best from the best of
    the tier above."""
    trace: str
    load: float
    metric: str
    better: str
    tiers: tuple
    steps: tuple            # Difference per tier boundary

    @property
    def separated(self) -> bool:
        return len(self.tiers) > 1


@dataclass(frozen=True)
class Mark:
    """A best cell: `ties` names the configurations the pairwise test does not separate from it."""
    ties: tuple = ()
    has_ci: bool = True

    @property
    def within_noise(self) -> bool:
        return bool(self.ties) or not self.has_ci


def replicate_values(runs: pd.DataFrame, metric: str) -> dict:
    """{replicate key: value} of one configuration's runs (a key seen twice keeps both, apart)."""
    keys = runs["replicate"].astype(str).tolist() if "replicate" in runs else [str(i) for i in range(len(runs))]
    seen: dict = {}
    out = {}
    for key, value in zip(keys, runs[metric].to_numpy(dtype=float)):
        seen[key] = seen.get(key, 0) + 1
        out[key if seen[key] == 1 else f"{key}#{seen[key]}"] = value
    return out


def repeated(runs: pd.DataFrame) -> bool:
    """Replicates that gave identical results on every metric: one measurement, not several."""
    return len(runs) > 1 and bool((runs[METRICS].nunique(dropna=False) <= 1).all())


def rankings(df: pd.DataFrame, agg: pd.DataFrame) -> list[Ranking]:
    """Every ranked metric of every trace and load with at least two complete configurations."""
    out = []
    complete_runs = df[~df["partial"].astype(bool)] if "partial" in df else df
    for (trace, load), group in agg.groupby(GROUP, sort=False):
        if "partial" in group:
            group = group[~group["partial"].astype(bool)]
        runs = complete_runs[(complete_runs["trace"] == trace) & (complete_runs["load"] == load)]
        by_label = {label: cell for label, cell in runs.groupby("label", sort=False)}
        testable = {label for label, cell in by_label.items() if not repeated(cell)}
        for c in COLUMNS:
            if not c.better or c.label not in group:
                continue
            cells = group[np.isfinite(group[c.label].to_numpy(dtype=float))]
            if len(cells) < 2:
                continue
            order = cells.sort_values(c.label, ascending=c.better == "min", kind="stable")["label"].tolist()
            out.append(_ranking(trace, load, c, order, by_label, testable))
    return out


def _ranking(trace, load, column, order: list, by_label: dict, testable: set) -> Ranking:
    tiers, steps = [[order[0]]], []
    for label in order[1:]:
        head = tiers[-1][0]
        d = None
        if head in testable and label in testable:
            d = difference(replicate_values(by_label[head], column.label),
                           replicate_values(by_label[label], column.label), head, label)
        if d is not None and d.separated and round(abs(d.mean), column.digits) > 0:
            tiers.append([label])
            steps.append(d)
        else:
            tiers[-1].append(label)
    return Ranking(trace, load, column.label, column.better, tuple(map(tuple, tiers)), tuple(steps))


def best_marks(agg: pd.DataFrame, ranked: list[Ranking]) -> dict:
    """(row index, metric) → Mark for each metric's best configuration within each trace and
    load (ties at the shown digits all marked); a configuration the pairwise test does not
    separate from it is a tie within noise. Groups of one configuration and metrics equal
    across the group get no mark."""
    marks = {}
    rows = {(t, l, lab): i for i, t, l, lab in zip(agg.index, agg["trace"], agg["load"], agg["label"])}
    for r in ranked:
        column = SHOWN[r.metric]
        means = {lab: round(float(agg.at[rows[(r.trace, r.load, lab)], r.metric]), column.digits)
                 for tier in r.tiers for lab in tier}
        if len(set(means.values())) < 2:
            continue
        best = means[r.tiers[0][0]]
        top = [lab for lab in r.tiers[0] if means[lab] == best]
        for lab in top:
            i = rows[(r.trace, r.load, lab)]
            ties = tuple(other for other in r.tiers[0] if other not in top)
            marks[(i, r.metric)] = Mark(ties, bool(np.isfinite(agg.at[i, f"{r.metric} low"])))
    return marks


def steps_text(r: Ranking) -> str:
    """`a ≈ b, ahead of c by 562.33 ms (95% CI 104.12 to 1,020.54; paired over 3 replicates)`; each
    further tier `in turn ahead of` the next (its difference is from the tier above it)."""
    column = SHOWN[r.metric]
    unit = column.unit or ""
    unit = " points" if unit == "%" else f" {unit}" if unit else ""
    text = " ≈ ".join(r.tiers[0])
    for k, (tier, d) in enumerate(zip(r.tiers[1:], r.steps)):
        text += f", {'in turn ' if k else ''}ahead of {' ≈ '.join(tier)} by {_number(abs(d.mean), column.digits)}" \
                f"{unit} ({_ci(d, column.digits)})"
    return text


def _number(x: float, digits: int) -> str:
    return f"{x:,.{digits}f}"


def _ci(d: Difference, digits: int) -> str:
    low, high = sorted((abs(d.low), abs(d.high))) if d.low * d.high > 0 else (d.low, d.high)
    test = f"paired over {d.n} replicates" if d.method == "paired" else f"bootstrap, {d.n}+ replicates each"
    return f"95% CI {_number(low, digits)} to {_number(high, digits)}; {test}"
