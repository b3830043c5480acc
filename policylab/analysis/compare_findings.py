"""What a comparison says in words: the rankings that separate configurations (findings), and
the warnings that make a comparison uninformative (partial runs, replicates that are not, no
separation at all, a load too light or too heavy for policies to differ).

A finding is one line per metric on which the pairwise tests of `compare_stats` separate some
configurations: the tiers, best first, and by how much each tier trails the one above, with the
95 % interval of that difference and the test that gave it.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from policylab.analysis.compare_stats import CELL, GROUP, SHOWN, Ranking, repeated, steps_text

LIGHT_KV = 50.0                 # KV peak (%) below which the cache is never a constraint
LIGHT_QUEUE = 0.1               # p99 queueing below this share of the TTFT SLO: no queueing
ALL_MET = 100.0                 # SLO attainment (%) of a configuration that met every SLO
COLLAPSED = 50.0                # below this attainment (%) most requests miss their SLOs
LIGHT_LOAD_TRY, HEAVY_LOAD_TRY = 0.9, 0.7     # trace.load to suggest when nothing else is known
ATTAINMENT = "SLO attainment (%)"


def where(trace: str, load: float, capacity_load=None) -> str:
    """`azure at load ×2`, or `azure at load 0.8 of capacity (×5.13)` for runs given trace.load."""
    if capacity_load is not None and np.isfinite(capacity_load):
        return f"{trace} at load {capacity_load:g} of capacity (×{load:.3g})"
    return f"{trace} at load ×{load:g}"


def _capacity_load(group: pd.DataFrame):
    return group["capacity_load"].mean() if "capacity_load" in group else None


def findings(agg: pd.DataFrame, ranked: list[Ranking], metrics=None) -> list[str]:
    """One line per (trace and load, metric) whose configurations fall into more than one tier
    (`metrics`: only these columns); then per group the ranked metrics that separate nothing."""
    lines = []
    by_group: dict = {}
    for r in ranked:
        if metrics is None or r.metric in metrics:
            by_group.setdefault((r.trace, r.load), []).append(r)
    for (trace, load), group in agg.groupby(GROUP, sort=False):
        here = where(trace, load, _capacity_load(group))
        rows = by_group.get((trace, load), [])
        for r in rows:
            if r.separated:
                arrow = "lower" if r.better == "min" else "higher"
                lines.append(f"{here}: {r.metric} ({arrow} is better): {steps_text(r)}")
        flat = [r.metric for r in rows if not r.separated and _varies(group, r.metric)]
        if flat and any(r.separated for r in rows):
            lines.append(f"{here}: not separated on {', '.join(flat)}")
    return lines


def _varies(group: pd.DataFrame, metric: str) -> bool:
    return group[metric].round(SHOWN[metric].digits).nunique(dropna=True) > 1


def warnings(df: pd.DataFrame, agg: pd.DataFrame, ranked: list[Ranking]) -> list[str]:
    """Sentences that make a comparison uninformative or misleading."""
    notes = []
    if "partial" in df:
        for run in df[df["partial"].astype(bool)].itertuples(index=False):
            why = f"; {run.error}" if run.error else ""
            notes.append(f"{run.label} on {run.trace} at load ×{run.load:g} ({run.run_dir}) is a partial run "
                         f"({run.finished} requests finished{why}): shown, never ranked against complete runs")
    for (trace, load, label), cell in df.groupby(CELL, sort=False):
        if repeated(cell):
            notes.append(f"{label} on {trace} at load ×{load:g}: its {len(cell)} replicates gave identical "
                         "results: the seed does not vary a sim replay of a trace file; use "
                         "trace.replicate=1,2,3 for replicates")
    separated = {(r.trace, r.load) for r in ranked if r.separated}
    for (trace, load), group in agg.groupby(GROUP, sort=False):
        complete = group[~group["partial"].astype(bool)] if "partial" in group else group
        fraction = _capacity_load(group)
        here = where(trace, load, fraction)
        if len(complete) > 1 and complete["n"].min() > 1 and (trace, load) not in separated:
            notes.append(f"{here}: no two configurations are separated on any metric (pairwise 95% tests): this "
                         "comparison does not rank them; add replicates (trace.replicate=1,2,3,4,5) or change "
                         "the load (trace.load)")
        elif len(complete) > 1 and complete["n"].max() < 2:
            notes.append(f"{here}: one replicate per configuration: no interval and no ranking "
                         "(add trace.replicate=1,2,3)")
        hint = slo_hint(complete[ATTAINMENT].to_numpy(dtype=float) if ATTAINMENT in complete else [], fraction)
        if hint and len(complete) > 1:
            notes.append(f"{here}: {hint}")
        runs = df[(df["trace"] == trace) & (df["load"] == load)]
        light = light_load(runs["KV peak (%)"].max(), runs["queueing p99 (s)"].max(), runs["ttft_slo"].max())
        if light:
            notes.append(f"{here}: {light}")
    return notes


def slo_hint(attainments_pct, capacity_load=None, subject: str = "every configuration") -> str | None:
    """When SLO attainment cannot rank anything: `subject` (every configuration, this run) met
    every SLO (too light), or missed most of them (past capacity). The hint names a load to try."""
    values = np.asarray(attainments_pct, dtype=float)
    values = values[np.isfinite(values)]
    if not values.size:
        return None
    known = capacity_load is not None and np.isfinite(capacity_load)
    if (np.round(values, 1) >= ALL_MET).all():
        to = max(LIGHT_LOAD_TRY, round(1.25 * capacity_load, 2)) if known else LIGHT_LOAD_TRY
        return (f"load too light to rank on SLOs: {subject} met every SLO (100% attainment); "
                f"try trace.load={to:g} ({to:.0%} of the estimated capacity) or a higher trace.rate_scale")
    if (values < COLLAPSED).all():
        to = min(HEAVY_LOAD_TRY, round(0.7 * capacity_load, 2)) if known else HEAVY_LOAD_TRY
        return (f"load too heavy to rank on SLOs: {subject} missed the SLOs of most requests (attainment "
                f"below {COLLAPSED:g}%); try trace.load={to:g} ({to:.0%} of the estimated capacity) or a lower "
                "trace.rate_scale")
    return None


def light_load(kv_peak_pct, queueing_p99, ttft_slo) -> str | None:
    """Why a replay was too light for policies to differ (None when it was not)."""
    try:
        kv_peak_pct, queueing_p99 = float(kv_peak_pct), float(queueing_p99)
    except (TypeError, ValueError):           # no step ran, no request scheduled
        return None
    if not (math.isfinite(kv_peak_pct) and math.isfinite(queueing_p99)) or not ttft_slo:
        return None
    if kv_peak_pct < LIGHT_KV and queueing_p99 < LIGHT_QUEUE * ttft_slo:
        return (f"light load: KV peaked at {kv_peak_pct:.0f}% and p99 queueing was {queueing_p99 * 1e3:.0f} ms "
                f"(< {LIGHT_QUEUE:.0%} of the {ttft_slo:g} s TTFT SLO): scheduling policies barely differ "
                "here; raise trace.load (or trace.rate_scale, or lower engine.num_blocks)")
    return None


def tests_used(ranked: list[Ranking]) -> str:
    """Which tests decided the findings, in a few words."""
    used = {d.method for r in ranked for d in r.steps}
    parts = []
    if "paired" in used:
        parts.append("paired t on the replicate-by-replicate differences (the replicates share seed and trace "
                     "replicate)")
    if "bootstrap" in used:
        parts.append("percentile bootstrap of the difference of means (the replicates are not shared; optimistic "
                     "with few replicates)")
    return " and ".join(parts) if parts else ("paired t on replicate differences where the replicates share seeds, "
                                              "a percentile bootstrap otherwise")


def methods_note(ranked: list[Ranking]) -> str:
    """The footnote on how the findings were decided."""
    return (f"Findings: walking down from the best mean, a configuration starts a new tier when the 95% interval "
            f"of its difference from the best of the tier above excludes 0 ({tests_used(ranked)}); no correction "
            "for the number of comparisons.")

