"""The figures of `compare`, each written as PNG plus the data behind it as CSV.

- `cdf_compare`: TTFT/TPOT/ITL CDFs, one row of panels per trace and load, one line per
  configuration (its replicates' samples pooled), SLO lines at the SLOs the requests carry;
  the CSV holds each line's quantiles at 0, 0.5, ..., 100 %.
- `metric_vs_load`: SLO attainment, goodput, TTFT p99 and TPOT p99 against the offered rate,
  one line per configuration with its 95% interval as a band, one row per trace; the bands are
  `compare_stats`' intervals (inside each metric's limits) and every axis stays inside the
  metric's feasible range (no share above 100 %, nothing below 0).
- `capacity_compare`: every capacity search's attainment-vs-rate curve in one figure
  (capacity as DESIGN §6 defines it).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from policylab.analysis.compare_stats import GROUP, interval_of
from policylab.analysis.run_table import read_requests_file
from policylab.analysis.plots import CDF_METRICS, cdf_row, latency_samples, line_styles, read_requests, save, slo_lines

LOAD_METRICS = ("SLO attainment (%)", "goodput (req/s)", "TTFT p99 (ms)", "TPOT p99 (ms)")
QUANTILES = np.linspace(0, 100, 201)


def _legend(fig: Figure, styles: dict) -> None:
    fig.legend([Line2D([], [], **s) for s in styles.values()], list(styles), loc="outside lower center",
               ncols=min(len(styles), 4), fontsize="small")


def cdf_compare(runs: pd.DataFrame, out: Path) -> list[Path]:
    """PNG and CSV of the latency CDFs, one panel row per (trace, load)."""
    groups = list(runs.groupby(GROUP, sort=False))
    styles = line_styles(runs["label"])
    fig = Figure(figsize=(15, 1.2 + 3.6 * len(groups)), layout="constrained")
    fig.suptitle(f"latency CDFs of {len(runs)} runs (replicates pooled per configuration)")
    axes = np.atleast_2d(fig.subplots(len(groups), len(CDF_METRICS), squeeze=False))
    rows = []
    for row, ((trace, load), group) in zip(axes, groups):
        samples, requests = {}, []
        for label, cell in group.groupby("label", sort=False):
            pooled = {m: [] for m in CDF_METRICS}
            for run_dir in cell["run_dir"]:
                path = Path(run_dir) / "requests.parquet"
                if not path.exists():
                    print(f"note: {path} missing, left out of the CDFs", file=sys.stderr)
                    continue
                req, with_tokens = read_requests_file(path, read_requests)
                requests.append(req[["ttft_slo", "tpot_slo"]])
                for m, v in latency_samples(req, with_tokens).items():
                    pooled[m].append(v)
            samples[label] = {m: np.concatenate(v) if v else np.array([]) for m, v in pooled.items()}
            for m, v in samples[label].items():
                if v.size:
                    rows += [{"trace": trace, "load": load, "configuration": label, "metric": m,
                              "quantile": q, "seconds": x} for q, x in zip(QUANTILES, np.percentile(v, QUANTILES))]
        slos = slo_lines(pd.concat(requests)) if requests else {}
        cdf_row(row, samples, slos, styles, what=f"{trace} ×{load:g}: " if len(groups) > 1 else "")
    _legend(fig, styles)
    pd.DataFrame(rows).to_csv(out / "cdf_compare.csv", index=False)
    return [save(fig, out / "cdf_compare.png"), out / "cdf_compare.csv"]


def metric_vs_load(agg: pd.DataFrame, out: Path) -> list[Path]:
    """PNG and CSV of LOAD_METRICS against the offered rate, for traces run at ≥ 2 loads."""
    swept = agg.groupby("trace", sort=False).filter(lambda g: g["load"].nunique() > 1)
    if swept.empty:
        return []
    columns = ["trace", "load", "rate", "label", "n",
               *(c for m in LOAD_METRICS for c in (m, f"{m} low", f"{m} high"))]
    swept[columns].rename(columns={"label": "configuration"}).to_csv(out / "metric_vs_load.csv", index=False)
    return [save(load_figure(swept), out / "metric_vs_load.png"), out / "metric_vs_load.csv"]


def load_figure(swept: pd.DataFrame) -> Figure:
    """LOAD_METRICS against the offered rate, one row of panels per trace of `swept`."""
    traces = list(dict.fromkeys(swept["trace"]))
    styles = line_styles(swept["label"])
    fig = Figure(figsize=(16, 1.2 + 3.8 * len(traces)), layout="constrained")
    fig.suptitle("metrics against load: mean of the replicates, band = its 95% interval")
    axes = fig.subplots(len(traces), len(LOAD_METRICS), squeeze=False)
    for row, trace in zip(axes, traces):
        of_trace = swept[swept["trace"] == trace]
        for ax, metric in zip(row, LOAD_METRICS):
            for label, line in of_trace.groupby("label", sort=False):
                line = line.sort_values("rate")
                mean = line[metric].to_numpy(float)
                low = line[f"{metric} low"].fillna(line[metric]).to_numpy(float)
                high = line[f"{metric} high"].fillna(line[metric]).to_numpy(float)
                ax.plot(line["rate"], mean, marker="o", clip_on=False, **styles[label])   # (a point at 100 % shows)
                ax.fill_between(line["rate"], low, high, color=styles[label]["color"], alpha=0.18)
            ax.set(title=f"{trace}: {metric}", xlabel="offered load (req/s)", ylabel=metric)
            ax.set_ylim(*feasible_ylim(ax.get_ylim(), interval_of(metric)[0]))
            ax.grid(alpha=0.3)
    _legend(fig, styles)
    return fig


def feasible_ylim(ylim: tuple, limits: tuple) -> tuple:
    """Matplotlib's y range cut to a metric's feasible range; a flat line at a limit (every
    configuration at 100 %) keeps a visible span below it instead of one across it."""
    low, high = max(ylim[0], limits[0]), min(ylim[1], limits[1])
    if high - low < 1e-9 * max(1.0, abs(high)):
        span = 0.05 * (abs(high) or 1.0)
        low, high = (high - span, high) if high >= limits[1] else (low, low + span)
        low = max(low, limits[0])
    return low, high


def read_capacity(capacity_dirs) -> pd.DataFrame:
    """One row per evaluated rate of every capacity search, with its policy, trace and result."""
    frames = []
    for d in map(Path, capacity_dirs):
        info = json.loads((d / "capacity.json").read_text())
        curve = pd.read_csv(d / "capacity.csv")
        curve["label"] = f"{info['policy']} [{d.name}]" if len(capacity_dirs) > 1 else info["policy"]
        curve["policy"], curve["trace"], curve["search_status"] = info["policy"], info["trace"], info["status"]
        curve["target"] = info.get("search", {}).get("target")
        curve["capacity_rate"] = info.get("rate")
        frames.append(curve)
    return pd.concat(frames, ignore_index=True)


def capacity_compare(curves: pd.DataFrame, out: Path) -> list[Path]:
    """Every search's SLO attainment against the arrival rate, its capacity marked."""
    curves["label"] = curves["policy"] if curves.groupby("policy")["label"].nunique().max() == 1 else curves["label"]
    styles = line_styles(curves["label"])
    fig = Figure(figsize=(10, 6.5), layout="constrained")
    ax = fig.subplots()
    for label, curve in curves.groupby("label", sort=False):
        curve = curve.sort_values("rate")
        ax.plot(curve["rate"], curve["slo_attainment"] * 100, marker="o", **styles[label])
        rate = curve["capacity_rate"].iloc[0]
        if pd.notna(rate):
            ax.axvline(rate, linewidth=0.8, **styles[label])
    for target in curves["target"].dropna().unique():
        ax.axhline(target * 100, color="black", linewidth=1, linestyle="--", label=f"target {target:.0%}")
    ax.set(xscale="log", ylim=(0, 105), xlabel="arrival rate (req/s, log scale)", ylabel="SLO attainment (%)",
           title="capacity searches: SLO attainment against the arrival rate\n"
                 "(dashed black: target; vertical lines: each policy's capacity)")
    ax.grid(alpha=0.3)
    _legend(fig, styles)
    curves.to_csv(out / "capacity_compare.csv", index=False)
    return [save(fig, out / "capacity_compare.png"), out / "capacity_compare.csv"]
