"""`python -m policylab compare RUN_OR_SWEEP_DIR... [-o OUT]`: runs side by side, with statistics.

Finds every run directory (one with a summary.json) and every capacity search (one with a
capacity.json) under the given paths. Runs are grouped by trace and load; runs differing
only in `seed` / `trace.replicate` are pooled into their mean and 95 % interval, and the
configurations are ranked per metric by pairwise tests (`compare_stats`). It writes into the
output folder: compare.md / compare.html (grouped table, findings, per-SLO-class and
per-client tables, figures), compare.csv (the grouped table), runs.csv (one row per run),
per_slo_class.csv, per_client.csv, and each figure as PNG + CSV (`compare_figures`); it
prints the table, the findings (which configurations the tests separate, by how much) and
every warning that makes the comparison uninformative (`compare_findings`).
With `--wandb-online` the runs also become a W&B report.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from policylab.analysis.breakdown import breakdowns
from policylab.analysis.compare_figures import capacity_compare, cdf_compare, metric_vs_load, read_capacity
from policylab.analysis.compare_findings import findings, methods_note, tests_used, warnings
from policylab.analysis.compare_stats import CI_NOTE, GROUP, aggregate, best_marks, rankings
from policylab.analysis.report import display_table, title_of, write_html, write_markdown
from policylab.analysis.run_table import PARTIAL, COLUMNS, CompareError, collect_runs, find_dirs, mixed_cost_models

PRINTED = ("SLO attainment (%)", "goodput (req/s)", "TTFT p99 (ms)", "TPOT p99 (ms)", "ITL p99 (ms)",
           "E2E p99 (s)", "preemptions", "KV peak (%)")
# shown when some run has a value that is not 0: runs of several clients, prefix sharing, clusters
OPTIONAL_PRINTED = ("Jain (windowed)", "prefix hit (%)", "load imbalance", "goodput/GPU (req/s)",
                    "recomputed tokens", "swap transfer (s)",   # (these two: runs with a host KV tier)
                    "session time p50 (s)", "session time p99 (s)",   # closed-loop sessions
                    "host hit (%)", "disk hit (%)", "host-tier transfer (s)", "disk-tier transfer (s)")   # prefix tiers
WIDTH = 120                                  # the printed table fits a 120-column terminal


SHORT_WORDS = {"attainment": "attain.", "preemptions": "preempt.", "(windowed)": "window", "imbalance": "imbal.",
               "goodput/GPU": "goodput/\nGPU", "recomputed": "recomp.", "transfer": "xfer",
               "host-tier": "host", "disk-tier": "disk"}


def short_header(label: str) -> str:
    """'SLO attainment (%) ↑' → 'SLO\nattain.\n%\n↑': one short word a line keeps columns narrow."""
    words = [SHORT_WORDS.get(w, w) for w in label.split(" ")]
    return "\n".join(w.strip("()") if w.startswith("(") and w.endswith(")") else w for w in words)


def _visible(text: str) -> int:
    """Width of a cell's longest line, markup left out."""
    import re
    tags = r"(?<!\\)\[(/?[a-zA-Z#@][^\[\]]*|/)\]"          # rich's markup (an interval `[1.0–2.0]` is text)
    return max(len(re.sub(tags, "", line).replace("\\[", "[")) for line in text.split("\n"))


def _width(headers, cells) -> int:
    """Characters the metric columns take (padding and separator: three each, as SIMPLE_HEAD draws them)."""
    return sum(max([_visible(h)] + [_visible(row[k]) for row in cells]) + 3 for k, h in enumerate(headers))


def _two_lines(cell: str) -> str:
    """`x ± ci ≈*` or `x [low–high] ≈*` over two lines."""
    for sep in (" ± ", " \\[", " ["):
        if sep in cell:
            return cell.replace(sep, "\n" + sep[1:], 1)
    return cell.replace(" ≈", "\n≈", 1)


def printed_columns(agg) -> tuple:
    """PRINTED and the OPTIONAL_PRINTED that say something, without columns no run has a value in."""
    def informative(m, optional):
        values = agg[m] if m in agg else None
        return values is not None and values.notna().any() and not (optional and (values.fillna(0) == 0).all())
    return tuple(m for m in PRINTED if informative(m, False)) + \
        tuple(m for m in OPTIONAL_PRINTED if informative(m, True))


def print_table(agg, marks, common) -> None:
    """One table per trace and load, at most WIDTH columns wide: headers one word a line, the
    configuration column folded, columns no run has a value in left out (all columns are in
    compare.md, compare.html and compare.csv)."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    console = Console()
    console = Console(width=min(console.width, WIDTH) if console.is_terminal else WIDTH)
    legend = (f"{int(agg['n'].sum())} runs, {CI_NOTE} ([low–high] where a limit makes it asymmetric); * = best "
              "in its trace and load, ≈ = not separated from another by the pairwise test")
    if "partial" in agg and agg["partial"].any():
        legend += f";{PARTIAL} = stopped early, never ranked"
    console.print(legend + (f"\ncommon overrides: {' '.join(common)}" if common else ""), markup=False)
    columns = printed_columns(agg)
    for (trace, load), group in agg.groupby(GROUP, sort=False):
        shown = display_table(group, columns, marks, lambda t: f"[bold green]{escape(t)}*[/]", plain=escape,
                              compact=True)
        shown = shown.drop(columns=["rate (req/s)"] + ([] if agg["n"].max() > 1 else ["n"]), errors="ignore")
        table = Table(title=title_of(group), title_justify="left",
                      title_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
        headers = [short_header(h) for h in shown.columns[1:]]
        cells = [[str(v) for v in shown.loc[i].iloc[1:]] for i in group.index]
        labels = [str(v) for v in shown.iloc[:, 0]]
        if _width(headers, cells) + min(max(map(len, labels)), 36) + 2 > console.width:
            cells = [[_two_lines(c) for c in row] for row in cells]     # `x ± ci ≈*` over two lines
        table.add_column(shown.columns[0], overflow="fold",
                         width=max(14, min(max(map(len, labels)), console.width - _width(headers, cells) - 2)))
        for h in headers:
            table.add_column(h, justify="right", overflow="fold")
        for label, row in zip(labels, cells):
            table.add_row(escape(label), *row)
        console.print(table)


def print_findings(lines: list[str], tests: str) -> None:
    """The findings on the printed columns (compare.md has every column's)."""
    if lines:
        print(f"findings, by pairwise tests at 95% ({tests}):")
        for line in lines:
            print(f"  {line}")


def compare_runs(run_dirs, out: Path, verbose: bool = True) -> tuple:
    """Tables, figures and warnings of the runs:
    (grouped table, marks, common, notes, breakdowns, files, findings, methods note)."""
    df, common = collect_runs(run_dirs)
    agg = aggregate(df)
    ranked = rankings(df, agg)
    marks = best_marks(agg, ranked)
    notes = mixed_cost_models(df) + warnings(df, agg, ranked)
    found, methods = findings(agg, ranked), methods_note(ranked)
    tables = breakdowns(df)
    if verbose:
        print_table(agg, marks, common)
    print_findings(findings(agg, ranked, printed_columns(agg)), tests_used(ranked))
    (out / "findings.txt").write_text("".join(f"{line}\n" for line in found))
    df.to_csv(out / "runs.csv", index=False)
    agg.to_csv(out / "compare.csv", index=False)
    files = [out / "compare.csv", out / "runs.csv", out / "findings.txt", *cdf_compare(df, out),
             *metric_vs_load(agg, out)]
    for kind, table in tables.items():
        path = out / f"per_{kind.replace(' ', '_').lower()}.csv"
        table.to_csv(path, index=False)
        files.append(path)
    return agg, marks, common, notes, tables, files, found, methods


def print_capacities(curves) -> None:
    """Each search's capacity and its bisection interval (passes at the low end, fails at the high)."""
    import pandas as pd
    for (label, status), c in curves.groupby(["label", "search_status"], sort=False):
        rate = c["capacity_rate"].iloc[0]
        above = c[c["rate"] > rate]["rate"] if pd.notna(rate) else c["rate"].iloc[:0]
        interval = f"[{rate:.3f}, {above.min():.3f}] req/s" if len(above) else "—"
        print(f"capacity of {label}: {status}, {rate:.3f} req/s, bisection interval {interval}")


def sweep_group(dirs) -> str | None:
    """The W&B group `run` gave a sweep's jobs (its directory's last two parts), when all share one."""
    parents = {Path(d).resolve().parent for d in dirs}
    return "_".join(parents.pop().parts[-2:]) if len(parents) == 1 else None


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m policylab compare", description=(
        "Compare run and capacity directories: grouped table with 95% CIs over replicates, per-SLO-class "
        "and per-client tables, CDFs, metric-vs-load and capacity figures (PNG + CSV), markdown and HTML."))
    p.add_argument("paths", nargs="+", metavar="RUN_OR_SWEEP_DIR")
    p.add_argument("-o", "--out", type=Path, help="output folder (default: <first path>/compare)")
    p.add_argument("--wandb-online", action="store_true",
                   help="also create a W&B report (needs `wandb login` and the reports extra): uploads the "
                        "runs logged offline, logs the comparison with its figures and tables, builds the report")
    p.add_argument("--log-wandb", action="store_true",
                   help="log the comparison (tables, figures, files) as a W&B run of its own; offline "
                        "unless --wandb-online")
    return p.parse_args(argv)


def main(argv=None, verbose: bool = True) -> int:
    """The command; `verbose=False` (the Python API) prints only the findings and the warnings."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        capacity_dirs = find_dirs(args.paths, "capacity.json")
        run_dirs = find_dirs(args.paths, "summary.json")
        if not run_dirs and not capacity_dirs:
            raise CompareError(f"{' '.join(args.paths)}: no run directory (one with a summary.json) "
                               "or capacity search (capacity.json) in it")
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = args.out or Path(args.paths[0]) / "compare"
    out.mkdir(parents=True, exist_ok=True)
    agg = marks = None
    common, notes, tables, files, found, methods = [], [], {}, [], [], ""
    if run_dirs:
        try:
            agg, marks, common, notes, tables, files, found, methods = compare_runs(run_dirs, out, verbose)
        except CompareError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if capacity_dirs:
        curves = read_capacity(capacity_dirs)
        print_capacities(curves)
        files += capacity_compare(curves, out)
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    figures = [f for f in files if f.suffix == ".png"]
    if agg is not None:
        files += [write_markdown(out, agg, marks, common, notes, tables, figures, found, methods),
                  write_html(out, agg, marks, common, notes, tables, figures, found, methods)]
    if verbose:
        print("wrote " + ", ".join(str(p) for p in files))
    if args.log_wandb and not args.wandb_online:     # (--wandb-online logs the comparison run itself)
        from policylab.analysis.tracking import log_comparison
        named = {"compare": agg, **{f"per_{k.replace(' ', '_').lower()}": t for k, t in tables.items()}} \
            if agg is not None else {}
        print(log_comparison(out, named, figures, sweep_group(run_dirs or capacity_dirs), args.wandb_online))
    if not args.wandb_online:
        if verbose:
            print("W&B report: skipped (offline; pass --wandb-online with a logged-in W&B API to create one)")
        return 0
    from policylab.analysis.tracking import ReportError
    from policylab.analysis.wandb_report import publish
    named = {"compare": agg, **{f"per_{k.replace(' ', '_').lower()}": t for k, t in tables.items()}} \
        if agg is not None else {}
    try:
        print(publish(run_dirs, [c.path for c in COLUMNS], out, named, figures, sweep_group(run_dirs or capacity_dirs)))
    except ReportError as e:
        print(f"error: W&B report not created: {e}", file=sys.stderr)
        return 1
    return 0
