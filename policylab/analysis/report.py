"""compare.md and compare.html: the grouped comparison table, the per-class and per-client
tables and the figures, built with pandas (`to_markdown`, `Styler`) rather than by hand.

Rows are grouped by trace and load; a cell is the replicates' mean with its 95 % interval,
`mean ± half-width` where it is symmetric and `mean [low–high]` where a limit of the metric
makes it asymmetric (shares near 0 or 100 %, values near 0). The best cell of a column within
a group is bold; `≈` marks a best that the pairwise test does not separate from another
configuration, or that has no interval (one replicate): a tie within noise. Under each group's
table come its findings: which configurations the tests separate, and by how much.
"""
from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pandas as pd

from policylab.analysis.compare_findings import where
from policylab.analysis.compare_stats import CI_NOTE, GROUP, INTERVAL_NOTE
from policylab.analysis.run_table import COLUMNS

DIGITS = {c.label: c.digits for c in COLUMNS} | {"requests": 0, "SLO attainment (%)": 1,
                                                 "TTFT p99 (ms)": 1, "TPOT p99 (ms)": 2}
ARROWS = {c.label: {"min": "↓", "max": "↑"}.get(c.better, "") for c in COLUMNS}
LEGEND = (f"Cells: {CI_NOTE}; n = replicates. {INTERVAL_NOTE} Best of each column within a trace and load "
          "in bold (↓ lower is better, ↑ higher is better); ≈ = that best is within noise (the pairwise test does "
          "not separate it from another configuration, or n = 1). A configuration marked (partial) stopped before "
          "every request ended: its metrics cover only the requests that did, so it is shown but never ranked.")


def cell_text(mean, low, high, digits: int, compact: bool = False) -> str:
    """`mean ± half` for a symmetric interval, `mean [low–high]` for one a limit cut, `mean` alone
    without an interval; `compact`: the bounds to two significant digits (a terminal's table)."""
    if mean is None or not np.isfinite(mean):
        return "—"
    text = f"{mean:,.{digits}f}"
    if low is None or high is None or not (np.isfinite(low) and np.isfinite(high)):
        return text
    below, above = mean - low, high - mean
    if abs(below - above) <= 1e-9 * max(1.0, abs(mean)):
        return f"{text} ± {above:,.{digits}f}"
    bound = (lambda x: _short(x, digits)) if compact else (lambda x: f"{x:,.{digits}f}")
    return f"{text} [{bound(low)}–{bound(high)}]"


def _short(x: float, digits: int) -> str:
    """`x` to two significant digits or its whole part, never more decimals than `digits`: 0, 0.11,
    7.6, 85, 1,683 (an interval's bounds in a terminal's narrow columns)."""
    if x == 0:
        return "0"
    decimals = min(digits, max(0, 1 - int(np.floor(np.log10(abs(x))))))
    return f"{x:,.{decimals}f}"


def display_table(agg: pd.DataFrame, metrics, marks: dict | None = None, bold=lambda t: t,
                  plain=lambda t: t, compact: bool = False) -> pd.DataFrame:
    """Display strings: configuration, n, (rate,) one `mean ± ci` column per metric, best marked."""
    marks = marks or {}
    out = pd.DataFrame({"configuration": agg["label"], "n": agg["n"]})
    if "group" in agg:
        out.insert(1, "group", agg["group"])
    if "rate" in agg:
        out["rate (req/s)"] = agg["rate"].map(lambda r: cell_text(r, None, None, 2))
    for m in metrics:
        bounds = f"{m} low" in agg and f"{m} high" in agg
        texts = [cell_text(agg.at[i, m], agg.at[i, f"{m} low"] if bounds else None,
                           agg.at[i, f"{m} high"] if bounds else None, DIGITS.get(m, 2), compact)
                 for i in agg.index]
        for k, i in enumerate(agg.index):
            mark = marks.get((i, m))
            texts[k] = plain(texts[k]) if mark is None else bold(texts[k] + (" ≈" if mark.within_noise else ""))
        out[f"{m} {ARROWS.get(m, '')}".strip()] = texts
    return out.set_axis(agg.index)


def group_title(trace: str, load: float, rate, capacity_load=None) -> str:
    return where(trace, load, capacity_load) + (f" ({rate:,.2f} req/s)" if rate is not None and np.isfinite(rate)
                                                else "")


def title_of(group) -> str:
    """The title of one trace-and-load group of a grouped table."""
    trace, load = group["trace"].iloc[0], group["load"].iloc[0]
    return group_title(trace, load, group["rate"].mean() if "rate" in group else None,
                       group["capacity_load"].mean() if "capacity_load" in group else None)


def _markdown_sections(agg, metrics, marks, heading: str, found=()) -> list[str]:
    lines = []
    for (trace, load), group in agg.groupby(GROUP, sort=False):
        lines += [f"{heading} {title_of(group)}", "",
                  display_table(group, metrics, marks, lambda t: f"**{t}**").to_markdown(index=False), ""]
        ties = [f"{m}: {group.at[i, 'label']} ≈ {', '.join(marks[(i, m)].ties)}"
                for m in metrics for i in group.index if (i, m) in marks and marks[(i, m)].ties]
        if ties:
            lines += ["Best within noise (not separated by the pairwise test): " + "; ".join(ties) + ".", ""]
        title = where(trace, load, group["capacity_load"].mean() if "capacity_load" in group else None)
        here = [f for f in found if f.startswith(title + ":")]
        if here:
            lines += ["Findings:", "", *(f"- {f}" for f in here), ""]
    return lines


def write_markdown(out: Path, agg, marks, common, notes, breakdowns: dict, figures: list[Path],
                   found=(), methods: str = "") -> Path:
    metrics = [c.label for c in COLUMNS]
    lines = [f"# Comparison of {int(agg['n'].sum())} runs ({len(agg)} configuration-and-load cells)", ""]
    if common:
        lines += [f"Common overrides: `{' '.join(common)}`", ""]
    lines += [LEGEND + (f" {methods}" if methods else ""), ""]
    if notes:
        lines += ["**Warnings:**", "", *(f"- {n}" for n in notes), ""]
    lines += _markdown_sections(agg, _with_values(agg, metrics), marks, "##", found)
    for kind, table in breakdowns.items():
        lines += [f"## Per {kind}", ""]
        lines += _markdown_sections(table, ["SLO attainment (%)", "TTFT p99 (ms)", "TPOT p99 (ms)"], {}, "###")
    lines += [f"![{p.stem}]({p.name})\n" for p in figures]
    path = out / "compare.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def styled_html(agg, metrics, marks) -> str:
    """One HTML table, rows indexed by (trace and load, configuration); best cells styled."""
    shown = display_table(agg, metrics)
    rates = agg["rate"] if "rate" in agg else [None] * len(agg)
    shares = agg["capacity_load"] if "capacity_load" in agg else [None] * len(agg)
    levels = {"trace and load": [group_title(t, l, r, c) for t, l, r, c in zip(agg["trace"], agg["load"], rates,
                                                                                   shares)],
              "configuration": shown.pop("configuration")}
    if "group" in shown:
        levels["group"] = shown.pop("group")
    shown.index = pd.MultiIndex.from_arrays(list(levels.values()), names=list(levels))
    columns = {m: f"{m} {ARROWS.get(m, '')}".strip() for m in metrics}
    style = pd.DataFrame("", index=shown.index, columns=shown.columns)
    for (i, m), mark in marks.items():
        style.iloc[agg.index.get_loc(i), shown.columns.get_loc(columns[m])] = \
            "font-weight:bold;color:" + ("#9a6700" if mark.within_noise else "#106b21")
    shown = shown.map(lambda v: html.escape(v) if isinstance(v, str) else v)
    return shown.style.apply(lambda _: style, axis=None).to_html()


def _scrolling(table_html: str) -> str:
    """A wide table scrolls inside its own box instead of widening the page."""
    return f'<div class="table-wrap">{table_html}</div>'


def _with_values(agg, metrics) -> list:
    """The metrics some row has a value for (a column of dashes only says the runs lack it)."""
    return [m for m in metrics if m in agg and agg[m].notna().any()]


def write_html(out: Path, agg, marks, common, notes, breakdowns: dict, figures: list[Path],
               found=(), methods: str = "") -> Path:
    metrics = [c.label for c in COLUMNS]
    parts = [f"<h1>Comparison of {int(agg['n'].sum())} runs</h1>"]
    if common:
        parts.append(f"<p>Common overrides: <code>{html.escape(' '.join(common))}</code></p>")
    parts.append(f"<p>{html.escape(LEGEND)} {html.escape(methods)} Bold green: best; bold amber: best within "
                 "noise.</p>")
    if notes:
        parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    parts.append(_scrolling(styled_html(agg, _with_values(agg, metrics), marks)))
    if found:
        parts.append("<h2>Findings</h2><ul>" + "".join(f"<li>{html.escape(f)}</li>" for f in found) + "</ul>")
    for kind, table in breakdowns.items():
        parts += [f"<h2>Per {html.escape(kind)}</h2>",
                  _scrolling(styled_html(table, ["SLO attainment (%)", "TTFT p99 (ms)", "TPOT p99 (ms)"], {}))]
    parts += [f'<img src="{p.name}" alt="{p.stem}" style="max-width:100%">' for p in figures]
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>policylab comparison</title>"
            "<style>body{font-family:sans-serif;margin:2em;max-width:100%} .table-wrap{overflow-x:auto;"
            "max-width:100%;margin-bottom:1em} table{border-collapse:collapse;font-size:13px}"
            "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right} td{white-space:nowrap}"
            "th{white-space:normal;max-width:8em;vertical-align:bottom}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")
    path = out / "compare.html"
    path.write_text(page)
    return path
