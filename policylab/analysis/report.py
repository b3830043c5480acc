"""compare.md and compare.html: the grouped comparison table, the per-class and per-client
tables and the figures, built with pandas (`to_markdown`, `Styler`) rather than by hand.

Rows are grouped by trace and load; a cell is `mean ± CI half-width` over replicates. The
best cell of a column within a group is bold; `≈` marks a best whose 95% interval overlaps
another configuration's, or that has no interval (one replicate): a tie within noise.
"""
from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pandas as pd

from policylab.analysis.compare_stats import CI_NOTE, GROUP
from policylab.analysis.run_table import COLUMNS

DIGITS = {c.label: c.digits for c in COLUMNS} | {"requests": 0, "SLO attainment (%)": 1,
                                                 "TTFT p99 (ms)": 1, "TPOT p99 (ms)": 2}
ARROWS = {c.label: {"min": "↓", "max": "↑"}.get(c.better, "") for c in COLUMNS}
LEGEND = (f"Cells: {CI_NOTE}; n = replicates. Best of each column within a trace and load in bold "
          "(↓ lower is better, ↑ higher is better); ≈ = that best is within noise (its interval overlaps "
          "another configuration's, or n = 1). A configuration marked (partial) stopped before every request "
          "ended: its metrics cover only the requests that did, so it is shown but never ranked.")


def cell_text(mean, half, digits: int) -> str:
    if mean is None or not np.isfinite(mean):
        return "—"
    text = f"{mean:,.{digits}f}"
    return f"{text} ± {half:,.{digits}f}" if half is not None and np.isfinite(half) else text


def display_table(agg: pd.DataFrame, metrics, marks: dict | None = None, bold=lambda t: t) -> pd.DataFrame:
    """Display strings: configuration, n, (rate,) one `mean ± ci` column per metric, best marked."""
    marks = marks or {}
    out = pd.DataFrame({"configuration": agg["label"], "n": agg["n"]})
    if "group" in agg:
        out.insert(1, "group", agg["group"])
    if "rate" in agg:
        out["rate (req/s)"] = agg["rate"].map(lambda r: cell_text(r, None, 2))
    for m in metrics:
        texts = [cell_text(agg.at[i, m], agg.at[i, f"{m} ±"] if f"{m} ±" in agg else None, DIGITS.get(m, 2))
                 for i in agg.index]
        for k, i in enumerate(agg.index):
            mark = marks.get((i, m))
            if mark is not None:
                texts[k] = bold(texts[k] + (" ≈" if mark.within_noise else ""))
        out[f"{m} {ARROWS.get(m, '')}".strip()] = texts
    return out.set_axis(agg.index)


def group_title(trace: str, load: float, rate) -> str:
    return f"{trace} at load ×{load:g}" + (f" ({rate:,.2f} req/s)" if rate is not None and np.isfinite(rate) else "")


def _markdown_sections(agg, metrics, marks, heading: str) -> list[str]:
    lines = []
    for (trace, load), group in agg.groupby(GROUP, sort=False):
        rate = group["rate"].mean() if "rate" in group else None
        lines += [f"{heading} {group_title(trace, load, rate)}", "",
                  display_table(group, metrics, marks, lambda t: f"**{t}**").to_markdown(index=False), ""]
        ties = [f"{m}: {group.at[i, 'label']} ≈ {', '.join(marks[(i, m)].overlaps)}"
                for m in metrics for i in group.index if (i, m) in marks and marks[(i, m)].overlaps]
        if ties:
            lines += ["Best within noise (95% intervals overlap): " + "; ".join(ties) + ".", ""]
    return lines


def write_markdown(out: Path, agg, marks, common, notes, breakdowns: dict, figures: list[Path]) -> Path:
    metrics = [c.label for c in COLUMNS]
    lines = [f"# Comparison of {int(agg['n'].sum())} runs ({len(agg)} configuration-and-load cells)", ""]
    if common:
        lines += [f"Common overrides: `{' '.join(common)}`", ""]
    lines += [LEGEND, ""]
    if notes:
        lines += ["**Warnings:**", "", *(f"- {n}" for n in notes), ""]
    lines += _markdown_sections(agg, _with_values(agg, metrics), marks, "##")
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
    levels = {"trace and load": [group_title(t, l, r) for t, l, r in zip(agg["trace"], agg["load"], rates)],
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


def write_html(out: Path, agg, marks, common, notes, breakdowns: dict, figures: list[Path]) -> Path:
    metrics = [c.label for c in COLUMNS]
    parts = [f"<h1>Comparison of {int(agg['n'].sum())} runs</h1>"]
    if common:
        parts.append(f"<p>Common overrides: <code>{html.escape(' '.join(common))}</code></p>")
    parts.append(f"<p>{html.escape(LEGEND)} Bold green: best; bold amber: best within noise.</p>")
    if notes:
        parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    parts.append(_scrolling(styled_html(agg, _with_values(agg, metrics), marks)))
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
