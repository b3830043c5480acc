"""`python -m policylab compare RUN_DIR_OR_MULTIRUN_DIR... [-o OUT]`: runs side by side.

Finds every run directory (one with a summary.json) under the given paths and writes, into
the output folder, a table of key metrics (best per column marked), overlaid TTFT/TPOT/ITL
CDFs, a markdown and an HTML page; the table is also printed. Parameters that differ
between runs come from each run's Hydra `.hydra/overrides.yaml`. With `--wandb-online`
the same runs also become a W&B report.
"""
from __future__ import annotations

import argparse
import html
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from policylab.analysis.plots import cdf_figure, latency_samples, save

CDF_FILE = "cdf_compare.png"


@dataclass(frozen=True)
class Column:
    label: str
    path: tuple            # keys into summary.json
    scale: float           # summary unit → shown unit
    better: str            # min | max
    digits: int


COLUMNS = (
    Column("TTFT p50 (ms)", ("ttft", "p50"), 1e3, "min", 1),
    Column("TTFT p99 (ms)", ("ttft", "p99"), 1e3, "min", 1),
    Column("TPOT p50 (ms)", ("tpot", "p50"), 1e3, "min", 2),
    Column("TPOT p99 (ms)", ("tpot", "p99"), 1e3, "min", 2),
    Column("ITL p99 (ms)", ("itl", "p99"), 1e3, "min", 2),
    Column("E2E p99 (s)", ("e2e", "p99"), 1.0, "min", 3),
    Column("goodput (req/s)", ("goodput",), 1.0, "max", 3),
    Column("SLO attainment (%)", ("slo_attainment",), 100.0, "max", 1),
    Column("throughput (out tok/s)", ("throughput", "output_tokens_per_s"), 1.0, "max", 1),
    Column("preemptions", ("preemptions",), 1.0, "min", 0),
)


class CompareError(Exception):
    """Bad input (no runs, unreadable summary): printed as one line."""


def natural_key(path: Path) -> list:
    """`2_x` before `10_x`: Hydra job numbers sort as numbers."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def find_run_dirs(paths) -> list[Path]:
    """Each path that is a run directory, else every run directory below it, in natural order."""
    found: list[Path] = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise CompareError(f"{path}: no such directory")
        below = [path] if (path / "summary.json").is_file() else \
            sorted((p.parent for p in path.rglob("summary.json") if "wandb" not in p.relative_to(path).parts),
                   key=natural_key)   # W&B keeps a copy of each run's files under wandb/
        if not below:
            raise CompareError(f"{path}: no run directory (one with a summary.json) in it")
        found += [p for p in below if p not in found]
    return found


def read_overrides(run_dir: Path) -> list[str]:
    path = run_dir / ".hydra" / "overrides.yaml"
    return [str(o) for o in yaml.safe_load(path.read_text()) or []] if path.exists() else []


def summary_value(summary: dict, path: tuple):
    for key in path:
        summary = summary.get(key) if isinstance(summary, dict) else None
    return summary


def collect_runs(run_dirs) -> tuple[pd.DataFrame, list[str]]:
    """One row per run (label, policy, params, status, run_dir, metric columns in shown units),
    and the overrides common to all runs (left out of each row's params)."""
    overrides = [read_overrides(d) for d in run_dirs]
    common = [o for o in overrides[0] if all(o in os for os in overrides)] if overrides else []
    rows = []
    for run_dir, own in zip(run_dirs, overrides):
        try:
            summary = json.loads((run_dir / "summary.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CompareError(f"{run_dir / 'summary.json'}: unreadable ({e})") from None
        policy = summary.get("policy", "?")
        params = " ".join(o for o in own if o not in common and o != f"policy={policy}")
        row = {"label": "", "policy": policy, "params": params,
               "status": summary.get("status", "?"), "run_dir": str(run_dir)}
        for c in COLUMNS:
            value = summary_value(summary, c.path)
            row[c.label] = None if value is None else value * c.scale
        rows.append(row)
    df = pd.DataFrame(rows, columns=["label", "policy", "params", "status", "run_dir",
                                     *(c.label for c in COLUMNS)])
    df["label"] = [_label(r, df) for r in df.itertuples()]
    return df, common


def _label(row, df: pd.DataFrame) -> str:
    """policy plus its varying parameters; the run directory's name when that is still ambiguous."""
    label = f"{row.policy} {row.params}".strip()
    same = ((df["policy"] == row.policy) & (df["params"] == row.params)).sum()
    return label if same == 1 else f"{label} [{Path(row.run_dir).name}]"


def best_rows(df: pd.DataFrame) -> dict:
    """Column label → indices of the rows holding that column's best value as shown (rounded
    to the column's digits, so ties all marked); columns where every run is equal get none."""
    best = {}
    for c in COLUMNS:
        values = pd.to_numeric(df[c.label], errors="coerce").round(c.digits)
        if values.nunique() > 1:
            target = values.min() if c.better == "min" else values.max()
            best[c.label] = set(df.index[values == target])
    return best


def cell(value, column: Column) -> str:
    return "—" if value is None or pd.isna(value) else f"{value:,.{column.digits}f}"


def table_rows(df: pd.DataFrame, best: dict, mark) -> list[list[str]]:
    """Display strings per run; `mark(text)` decorates each column's best value."""
    return [[row["label"], row["status"], *(
        mark(cell(row[c.label], c)) if i in best.get(c.label, ()) else cell(row[c.label], c)
        for c in COLUMNS)] for i, row in df.iterrows()]


HEADER = ["run", "status", *(f"{c.label} {'↓' if c.better == 'min' else '↑'}" for c in COLUMNS)]


def write_markdown(df, best, common, out: Path) -> Path:
    lines = [f"# Comparison of {len(df)} runs", ""]
    if common:
        lines += [f"Common overrides: `{' '.join(common)}`", ""]
    lines += ["Best value per column in **bold** (↓ lower is better, ↑ higher is better).", "",
              "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(df, best, lambda t: f"**{t}**")]
    lines += ["", f"![latency CDFs]({CDF_FILE})", "", "Run directories:", ""]
    lines += [f"- {label}: `{d}`" for label, d in zip(df["label"], df["run_dir"])]
    path = out / "compare.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_html(df, best, common, out: Path) -> Path:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADER)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in table_rows(
        df.map(lambda v: html.escape(v) if isinstance(v, str) else v), best, lambda t: f"<b>{t}</b>"))
    note = f"<p>Common overrides: <code>{html.escape(' '.join(common))}</code></p>" if common else ""
    dirs = "".join(f"<li>{html.escape(l)}: <code>{html.escape(d)}</code></li>"
                   for l, d in zip(df["label"], df["run_dir"]))
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>policylab: comparison of {len(df)} runs</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}} td:first-child{{text-align:left}}
b{{color:#106b21}}</style></head><body>
<h1>Comparison of {len(df)} runs</h1>{note}
<p>Best value per column in <b>bold green</b> (↓ lower is better, ↑ higher is better).</p>
<table><tr>{head}</tr>{body}</table>
<img src="{CDF_FILE}" alt="latency CDFs" style="max-width:100%">
<h2>Run directories</h2><ul>{dirs}</ul></body></html>
"""
    path = out / "compare.html"
    path.write_text(page)
    return path


def write_cdfs(df: pd.DataFrame, out: Path) -> Path:
    runs = {}
    for label, run_dir in zip(df["label"], df["run_dir"]):
        requests = Path(run_dir) / "requests.parquet"
        if requests.exists():
            runs[label] = latency_samples(pd.read_parquet(requests))
        else:
            print(f"note: {requests} missing, {label} left out of the CDFs", file=sys.stderr)
    slo = json.loads((Path(df["run_dir"].iloc[0]) / "summary.json").read_text()).get("slo") or {}
    return save(cdf_figure(runs, slo, f"latency CDFs of {len(df)} runs"), out / CDF_FILE)


def print_table(df, best, common) -> None:
    from rich.console import Console
    from rich.table import Table
    console = Console()
    if not console.is_terminal:         # piped or captured: don't fold the table to 80 columns
        console = Console(width=240)
    table = Table(title=f"{len(df)} runs, * = best" + (f" (common: {' '.join(common)})" if common else ""),
                  title_justify="left")
    for i, h in enumerate(HEADER):
        table.add_column(h.replace(" (", "\n("), justify="left" if i < 2 else "right")
    for row in table_rows(df, best, lambda t: f"[bold green]{t}*[/]"):
        table.add_row(*row)
    console.print(table)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m policylab compare", description=(
        "Compare run directories: metric table (best marked), overlaid latency CDFs, markdown and HTML."))
    p.add_argument("paths", nargs="+", metavar="RUN_DIR_OR_MULTIRUN_DIR")
    p.add_argument("-o", "--out", type=Path, help="output folder (default: <first path>/compare)")
    p.add_argument("--wandb-online", action="store_true",
                   help="also create a W&B report of the runs (needs `wandb login`, wandb-workspaces)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        df, common = collect_runs(find_run_dirs(args.paths))
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = args.out or Path(args.paths[0]) / "compare"
    out.mkdir(parents=True, exist_ok=True)
    best = best_rows(df)
    print_table(df, best, common)
    df.to_csv(out / "compare.csv", index=False)
    written = [write_cdfs(df, out), write_markdown(df, best, common, out),
               write_html(df, best, common, out), out / "compare.csv"]
    print("wrote " + ", ".join(str(p) for p in written))
    if args.wandb_online:
        from policylab.analysis.tracking import create_report
        print(create_report(list(map(Path, df["run_dir"])), [c.path for c in COLUMNS], out / "compare.md"))
    else:
        print("W&B report: skipped (offline; pass --wandb-online with a logged-in W&B API to create one)")
    return 0
