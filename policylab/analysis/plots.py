"""PNG plots of a run directory: latency CDFs, latency over arrival time, an engine timeline.

Figures are built on `matplotlib.figure.Figure` with the Agg canvas, never pyplot, so
plotting changes no global backend and works in sweeps, threads and headless jobs. The
CDF figure takes several runs at once, so `policylab.analysis.compare` overlays runs with it.
"""
from __future__ import annotations

from dataclasses import dataclass

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from policylab.analysis.metrics import flat_times
from policylab.analysis.result_reading import read_columns

MAX_CDF_POINTS = 4000      # drawn points per CDF line (each one exact)
MAX_TIMELINE_POINTS = 2000
MAX_PLOTTED_REQUESTS = 50_000   # scatter points; requests whose token times feed the ITL CDF
PLOTTED_REQUEST_COLUMNS = ("status", "arrival_time", "ttft", "tpot", "e2e", "slo_met", "ttft_slo", "tpot_slo")
PLOTTED_STEP_COLUMNS = ("step", "clock", "duration", "prefill_tokens", "decode_tokens", "waiting", "running",
                        "kv_utilization", "preempted", "replica")    # (timeline_figure, cluster_timeline_figure)
TOKEN_RATE_BINS = 200
# (column label, to-display factor, unit) of the three CDF panels
CDF_METRICS = {"TTFT": (1.0, "s"), "TPOT": (1e3, "ms"), "ITL": (1e3, "ms")}
SLO_OFF_SCALE = 2.0         # an SLO beyond this × the largest sample is named, not drawn
TAIL_HEAVY = 10.0           # a CDF panel whose max exceeds this × its median gets a log x axis
MEANS, SUMS = "mean", "sum"
# how a bucket of consecutive steps becomes one point: event counts and time add up, levels average
STEP_AGGREGATION = {"clock": "first", "duration": SUMS, "batch_size": MEANS,
                    "prefill_tokens": MEANS, "decode_tokens": MEANS, "num_prefill_reqs": MEANS,
                    "num_decode_reqs": MEANS, "kv_used_blocks": MEANS, "kv_utilization": MEANS,
                    "waiting": MEANS, "running": MEANS, "preempted": SUMS, "rejected": SUMS}


@dataclass(frozen=True)
class PlotSettings:
    """`plots.*`: which files each figure becomes, latency axes on a log scale or not."""
    enabled: bool = True
    formats: tuple = ("png",)          # any of png, svg, pdf
    log_latency: bool = True           # CDF x axes and latency-over-time y axes (else: log only for heavy tails)
    dpi: int = 150


def write_run_plots(run_dir, settings: PlotSettings = PlotSettings()) -> list[Path]:
    """Write latency_cdf, latency_over_time and timeline (and cluster_timeline for a cluster run)
    into `run_dir`, each in every format of `settings`."""
    run_dir = Path(run_dir)
    requests, with_tokens = read_requests(run_dir / "requests.parquet", PLOTTED_REQUEST_COLUMNS)
    steps = read_columns(run_dir / "steps.parquet", PLOTTED_STEP_COLUMNS)   # (the columns drawn: a million
                                                                            # requests' tables are gigabytes)
    summary = read_summary(run_dir)
    label = summary.get("policy") or run_dir.name
    slo = summary.get("slo") or {}
    every = -(-len(requests) // MAX_PLOTTED_REQUESTS)          # scatter at most that many points
    log = settings.log_latency
    written = [*save_all(cdf_figure({label: latency_samples(requests, with_tokens)}, slo_lines(requests),
                                    f"{label}: latency CDFs", log=log or None), run_dir / "latency_cdf", settings),
               *save_all(latency_over_time_figure(requests.iloc[::max(every, 1)], slo, label, log=log),
                         run_dir / "latency_over_time", settings),
               *save_all(timeline_figure(steps, label), run_dir / "timeline", settings)]
    if "replica" in steps:
        from policylab.analysis.cluster_plots import cluster_timeline_figure
        roles = {k: v["role"] for k, v in (summary.get("cluster") or {}).get("replicas", {}).items()}
        written += save_all(cluster_timeline_figure(steps, label, roles), run_dir / "cluster_timeline", settings)
    return written


def read_summary(run_dir: Path) -> dict:
    path = Path(run_dir) / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def read_requests(path, columns=None) -> tuple:
    """(requests table, the requests whose `token_times` are read) of a requests.parquet (only
    `columns` of it and token_times, when given). Past MAX_PLOTTED_REQUESTS rows the first has no
    token_times and the second is a sample of whole row groups spread over the run (at most that
    many rows): a million requests' token times would not fit in memory as Python objects, and a
    plot does not need every one."""
    file = pq.ParquetFile(path)
    names = [c for c in file.schema_arrow.names if columns is None or c in columns or c == "token_times"]
    if file.metadata.num_rows <= MAX_PLOTTED_REQUESTS:
        requests = read_columns(file, names)
        return requests, requests
    columns = [c for c in names if c != "token_times"]
    groups = file.metadata.num_row_groups
    per_group = file.metadata.num_rows / groups
    take = np.unique(np.linspace(0, groups - 1, max(1, int(MAX_PLOTTED_REQUESTS // per_group))).astype(int))
    return read_columns(file, columns), read_columns(file, ["status", "token_times"], list(take))


def latency_samples(requests: pd.DataFrame, with_tokens: pd.DataFrame | None = None) -> dict:
    """Seconds, finished requests only (as the summary): TTFT and TPOT per request, ITL pooled
    (over `with_tokens`, the requests whose token_times were read, when given)."""
    finished = requests[requests["status"] == "finished"]
    tokens = finished if with_tokens is None else with_tokens[with_tokens["status"] == "finished"]
    return {"TTFT": finished["ttft"].dropna().to_numpy(), "TPOT": finished["tpot"].dropna().to_numpy(),
            "ITL": itl_values(tokens)}


def itl_values(requests: pd.DataFrame) -> np.ndarray:
    """Every gap between consecutive output tokens of the same request."""
    column = requests["token_times"].tolist()
    lengths = np.fromiter(map(len, column), dtype=np.int64, count=len(column))
    gaps = np.diff(flat_times(column))                # (a request's last token to the next one's first:
    ends = np.cumsum(lengths[lengths > 0])[:-1] - 1  # at each end of a stream but the last, dropped)
    return np.delete(gaps, ends) if ends.size else gaps


def line_styles(labels) -> dict:
    """A distinct (colour, line style) per label for any number of labels: tab10 colours up to
    10, evenly spaced colours of a colormap beyond, each paired with one of four dash patterns."""
    from matplotlib import colormaps
    labels = list(dict.fromkeys(labels))
    colors = [f"C{i}" for i in range(len(labels))] if len(labels) <= 10 else \
        [colormaps["turbo"](x) for x in np.linspace(0.05, 0.95, len(labels))]
    dashes = ("-", "--", "-.", ":")
    return {label: {"color": c, "linestyle": dashes[i % len(dashes)]} for i, (label, c) in enumerate(zip(labels, colors))}


def slo_lines(requests: pd.DataFrame) -> dict:
    """The distinct SLOs the requests carry (per-request or the global default), per CDF panel."""
    return {"TTFT": sorted(requests["ttft_slo"].dropna().unique()),
            "TPOT": sorted(requests["tpot_slo"].dropna().unique())}


def cdf_figure(runs: dict, slos: dict, title: str, styles: dict | None = None, log: bool | None = None) -> Figure:
    """One panel per CDF_METRICS entry, one line per run: `runs` maps a label to latency_samples,
    `slos` a panel name to its SLO values in seconds (each drawn as a dashed line)."""
    fig = Figure(figsize=(15, 4.6 + 0.25 * len(runs)), layout="constrained")
    fig.suptitle(title)
    styles = styles or line_styles(runs)
    cdf_row(fig.subplots(1, len(CDF_METRICS)), runs, slos, styles, log=log)
    handles = [Line2D([], [], **styles[label]) for label in runs]
    fig.legend(handles, list(runs), loc="outside lower center", ncols=min(len(runs), 3), fontsize="small")
    return fig


def cdf_row(axes, runs: dict, slos: dict, styles: dict, what: str = "", log: bool | None = None) -> None:
    """Draw the CDF_METRICS panels of `runs` (Axes.ecdf) into `axes`, SLOs as dashed lines; x on
    a log scale when `log` (positive samples), or when None and the tail is heavy."""
    for ax, (metric, (factor, unit)) in zip(axes, CDF_METRICS.items()):
        drawn = []
        for label, samples in runs.items():
            every = np.asarray(samples.get(metric, ()), dtype=float) * factor
            values, shares = cdf_points(every)
            if values.size:     # each drawn point weighs the samples it stands for: exact shares
                ax.ecdf(values, weights=np.diff(np.rint(shares * every.size), prepend=0), **styles[label])
                drawn.append(values)
        title, off = f"{what}{metric} CDF", []
        for i, limit in enumerate(slos.get(metric) or ()):
            if drawn and limit * factor > SLO_OFF_SCALE * max(v[-1] for v in drawn):
                off.append(f"{limit * factor:g}")            # a line would squash the data
            else:
                ax.axvline(limit * factor, color="black", linestyle=("--", ":", "-.")[i % 3], linewidth=1,
                           label=f"SLO {limit * factor:g} {unit}")
        if off:
            title += f" (SLO {', '.join(off)} {unit}: off the scale)"
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small", loc="lower right")
        on_log = bool(drawn) and (_tail_heavy(np.concatenate(drawn)) if log is None else
                                  bool(log) and (np.concatenate(drawn) > 0).any())
        if on_log:
            ax.set_xscale("log")
        if not drawn:
            ax.text(0.5, 0.5, "no samples", transform=ax.transAxes, ha="center")
        ax.set(title=title, xlabel=f"{metric} ({unit}{', log scale' if on_log else ''})",
               ylabel="fraction of samples", ylim=(0, 1.02))
        ax.grid(alpha=0.3)


def cdf_points(samples: np.ndarray, max_points: int = MAX_CDF_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF at no more than `max_points` of its own steps, min and max included.

    Every drawn point is exact (a sorted sample and its share); a 20k-request replay pools
    millions of ITL gaps, and drawing each of them cost seconds for no visible difference."""
    values = np.sort(samples)
    n = values.size
    if n <= max_points:
        return values, np.arange(1, n + 1) / max(n, 1)
    keep = np.unique(np.linspace(0, n - 1, max_points).astype(np.int64))
    return values[keep], (keep + 1) / n            # (the shares of the kept points only: the same values)


def _tail_heavy(values: np.ndarray) -> bool:
    """A tail far beyond the median reads better on a log axis."""
    positive = values[values > 0]
    return positive.size > 1 and positive.max() > TAIL_HEAVY * np.median(positive)


def latency_over_time_figure(requests: pd.DataFrame, slo: dict, label: str, log: bool = False) -> Figure:
    """TTFT and E2E of each finished request against its arrival time; misses in red."""
    fig = Figure(figsize=(12, 7), layout="constrained")
    fig.suptitle(f"{label}: latency by arrival time")
    top, bottom = fig.subplots(2, 1, sharex=True)
    finished = requests[requests["status"] == "finished"]
    met = finished["slo_met"].to_numpy(dtype=bool)
    for ax, column, name in ((top, "ttft", "TTFT"), (bottom, "e2e", "E2E")):
        for mask, color, what in ((met, "tab:green", "SLO met"), (~met, "tab:red", "SLO missed")):
            if mask.any():
                ax.scatter(finished["arrival_time"][mask], finished[column][mask], s=6, color=color,
                           alpha=0.6, label=f"{what} ({mask.sum():,})", rasterized=True)
        positive = (finished[column] > 0).any()
        if log and positive:
            ax.set_yscale("log")
        ax.set(ylabel=f"{name} (s{', log scale' if log and positive else ''})", title=f"{name} per finished request")
        ax.grid(alpha=0.3)
    for i, limit in enumerate(slo_lines(requests)["TTFT"] if "ttft_slo" in requests else [slo.get("ttft")]):
        if limit:
            top.axhline(limit, color="black", linestyle=("--", ":", "-.")[i % 3], linewidth=1,
                        label=f"TTFT SLO {limit:g} s")
    dropped = requests[requests["status"] != "finished"]
    if len(dropped):
        top.scatter(dropped["arrival_time"], np.zeros(len(dropped)), marker="x", s=18, color="black",
                    label=f"rejected/unfinished ({len(dropped):,}, at 0)")
    for ax in (top, bottom):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small", loc="upper left")
    bottom.set_xlabel("arrival time (s)")
    return fig


def downsample_steps(steps: pd.DataFrame, max_points: int) -> pd.DataFrame:
    """At most `max_points` rows: consecutive steps bucketed, aggregated by STEP_AGGREGATION.

    Each row keeps the `step` index of its bucket's first step; with few enough steps the
    table is returned unchanged.
    """
    if len(steps) <= max_points:
        return steps.reset_index(drop=True)
    bucket = np.arange(len(steps)) // -(-len(steps) // max_points)
    rules = {"step": "first", **{k: v for k, v in STEP_AGGREGATION.items() if k in steps.columns}}
    return steps.groupby(bucket).agg(rules).reset_index(drop=True)


def timeline_figure(steps: pd.DataFrame, label: str) -> Figure:
    """Queue lengths, batch composition and KV utilisation against the replay clock."""
    if steps.empty:
        fig = Figure(figsize=(12, 3), layout="constrained")
        fig.suptitle(f"{label}: engine timeline")
        fig.text(0.5, 0.5, "no engine step ran (every request rejected?)", ha="center")
        return fig
    s = downsample_steps(steps, MAX_TIMELINE_POINTS)
    note = "" if len(s) == len(steps) else f" (mean of every {-(-len(steps) // len(s))} steps)"
    fig = Figure(figsize=(12, 9), layout="constrained")
    fig.suptitle(f"{label}: engine timeline, {len(steps):,} steps{note}")
    queues, batch, kv = fig.subplots(3, 1, sharex=True)
    clock = s["clock"].to_numpy()
    queues.plot(clock, s["waiting"], label="waiting", color="tab:orange")
    queues.plot(clock, s["running"], label="running", color="tab:blue")
    queues.set(title="queue lengths", ylabel="requests")
    edges, rates = token_rates(steps, TOKEN_RATE_BINS)
    batch.stairs(rates["prefill_tokens"] + rates["decode_tokens"], edges, fill=True,
                 color="tab:purple", alpha=0.8, label="prefill")
    batch.stairs(rates["decode_tokens"], edges, fill=True, color="tab:cyan", label="decode")
    batch.set(title=f"batch composition ({len(edges) - 1} time bins)", ylabel="tokens/s processed")
    kv.plot(clock, s["kv_utilization"] * 100, color="tab:green", label="KV blocks in use")
    preempted = s["preempted"].to_numpy() > 0
    if preempted.any():
        kv.scatter(clock[preempted], np.full(preempted.sum(), 100.0), marker="v", color="tab:red",
                   s=14, label=f"preemptions ({int(s['preempted'].sum()):,})")
    kv.set(title="KV cache utilisation", ylabel="blocks in use (%)", ylim=(0, 105),
           xlabel="replay clock (s)")
    for ax in (queues, batch, kv):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="upper left")
    return fig


def token_rates(steps: pd.DataFrame, bins: int) -> tuple[np.ndarray, dict]:
    """Prefill and decode tokens processed per second of replay clock, in equal time bins."""
    start = steps["clock"].to_numpy()
    end = start + steps["duration"].to_numpy()
    edges = np.linspace(start.min(), end.max(), max(1, min(bins, len(steps))) + 1)
    width = np.diff(edges)
    return edges, {k: np.histogram(start, edges, weights=steps[k].to_numpy())[0] / width
                   for k in ("prefill_tokens", "decode_tokens")}


def save(fig: Figure, path: Path, dpi: int = 110) -> Path:
    FigureCanvasAgg(fig)
    try:
        fig.savefig(path, dpi=dpi)
    except OSError as e:          # (a full disk: no half-drawn PNG left, and the file named)
        Path(path).unlink(missing_ok=True)
        raise OSError(e.errno, f"could not write {path}: {e.strerror or e}") from e
    return Path(path)


def save_all(fig: Figure, stem: Path, settings: PlotSettings) -> list[Path]:
    """The figure as `<stem>.<format>` for each format (vector formats ignore the dpi but for rasterized points)."""
    return [save(fig, Path(f"{stem}.{fmt}"), settings.dpi) for fmt in settings.formats]
