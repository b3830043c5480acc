"""`python -m policylab reproduce --list | NAME [NAME ...] | all [--replicates N] [--out DIR] [--quick]
[--gallery PAGE [--gallery-only]]`."""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from policylab.apps.reproduce import DEFAULT_REPLICATES, catalog as entry_catalog, reproduce

GALLERY_HEAD = """# Published results, reproduced

Each section replays one published scheduling result on the simulated data plane, as closely as
public data allows, and sets the paper's headline number beside the replay's: the mean over
replicates with its 95 % interval (replicates draw independent workloads, or bootstrap resamples
of a public trace; a ratio between two arms is paired within a replicate and pooled
geometrically). The verdict says whether the effect's **direction** holds (the whole interval on
the paper's side of 1: *holds*; only the mean: *holds, within noise*) and how its **magnitude**
compares (within 2× of the paper's number, or the factor it is off). Every difference from the
paper's setting is listed under *Substitutions*; where the direction does not hold, the section
says which substitution or missing mechanism explains it.

`python -m policylab reproduce --list` lists the entries; `python -m policylab reproduce NAME`
replays one (its files: `reproductions/NAME/`: `result.json`, `result.md`, `figure.png`, the
generated workloads and `runs.csv`, one row per replay); `reproduce all` replays every entry;
`policylab.reproduce("NAME")` does the same from Python. Numbers here are from the commit named in
each section; the simulator is deterministic, so the same command on that commit gives the same
numbers.

| entry | paper | the paper's number | the replay's | direction | magnitude |
|---|---|---|---|---|---|
"""


def list_entries() -> str:
    lines = []
    for name, e in entry_catalog().items():
        missing = e.missing_levers()
        status = f"waits for the {', '.join(missing)} lever" if missing or e.measure is None else "ready"
        lines.append(f"{name:10} {e.paper.venue:13} {status}\n           {e.title}")
        if missing or e.measure is None:
            lines.append(f"           planned: {e.planned}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m policylab reproduce",
                                     description="Replay published scheduling results beside the papers' numbers.")
    parser.add_argument("names", nargs="*", help="entries to replay (see --list), or 'all'")
    parser.add_argument("--list", action="store_true", help="list the entries and whether each can run")
    parser.add_argument("--replicates", type=int, default=DEFAULT_REPLICATES,
                        help=f"independent workloads per entry (default {DEFAULT_REPLICATES})")
    parser.add_argument("--out", default="reproductions", help="folder for the results (one subfolder per entry)")
    parser.add_argument("--quick", action="store_true", help="each entry's small version (its test's): minutes, not tens")
    parser.add_argument("--gallery", help="also write the gallery page (markdown) here, its figures beside it")
    parser.add_argument("--gallery-only", action="store_true",
                        help="replay nothing: write --gallery from the results already under --out")
    args = parser.parse_args(argv)
    catalog = entry_catalog()
    if args.gallery_only:
        if not args.gallery:
            print("error: reproduce: --gallery-only needs --gallery PAGE", file=sys.stderr)
            return 2
        results = {name: json.loads((Path(args.out) / name / "result.json").read_text()) for name in catalog
                   if (Path(args.out) / name / "result.json").is_file()}
        write_gallery(Path(args.gallery), Path(args.out), catalog, results)
        print(f"gallery: {args.gallery} ({len(results)} results from {args.out})")
        return 0
    if args.list or not args.names:
        print(list_entries())
        return 0
    names = list(catalog) if args.names == ["all"] else args.names
    unknown = [n for n in names if n not in catalog]
    if unknown:
        print(f"error: reproduce: no entry {', '.join(repr(n) for n in unknown)} (entries: {', '.join(catalog)})",
              file=sys.stderr)
        return 2
    started, results, failed = time.perf_counter(), {}, []
    for name in names:
        entry = catalog[name]
        if entry.missing_levers() or entry.measure is None:
            print(f"{name}: not replayed: waits for the {', '.join(entry.requires)} lever; planned: {entry.planned}\n")
            continue
        try:
            results[name] = reproduce(name, args.replicates, Path(args.out) / name, args.quick).result
        except Exception as e:           # one entry's failure (a missing download, ...) is reported, the rest run
            from policylab.apps.jobs import RunError
            from policylab.traces import TraceError
            known = isinstance(e, (RunError, TraceError, ValueError, OSError))
            print(f"{name}: failed: {e if known else f'{type(e).__name__}: {e}'}", file=sys.stderr)
            failed.append(name)
        print()
    wall = time.perf_counter() - started
    print(summary_table(results, catalog))
    print(f"\n{len(results)} replayed, {len(failed)} failed{': ' + ', '.join(failed) if failed else ''}; "
          f"wall time {wall / 60:.1f} min")
    if args.gallery:
        write_gallery(Path(args.gallery), Path(args.out), catalog, results)
        print(f"gallery: {args.gallery}")
    return 1 if failed else 0


def summary_table(results: dict, catalog: dict) -> str:
    lines = [f"{'entry':10} {'direction':26} magnitude"]
    for name, r in results.items():
        lines.append(f"{name:10} {r['verdict']['direction']:26} {r['verdict']['magnitude']}")
    for name, e in catalog.items():
        if name not in results and (e.missing_levers() or e.measure is None):
            lines.append(f"{name:10} {'waits for ' + ', '.join(e.requires):26} —")
    return "\n".join(lines)


def write_gallery(page: Path, out: Path, catalog: dict, results: dict) -> None:
    """The gallery page: one section per entry (replayed now, or waiting for a lever), figures
    copied to `figures/reproduce/` beside the page."""
    from policylab.apps.reproduce.report import measure_text, section, waiting_section
    figures = page.parent / "figures" / "reproduce"
    figures.mkdir(parents=True, exist_ok=True)
    rows, sections = [], []
    for name, entry in catalog.items():
        if name in results:
            r = results[name]
            shutil.copyfile(out / name / "figure.png", figures / f"{name}.png")
            claim = "; ".join(dict.fromkeys(c["paper_text"] for c in r["comparisons"] if c["paper_text"] != "—"))
            ours = "; ".join(measure_text(c["ours"]) for c in r["comparisons"])
            rows.append(f"| `{name}` | {entry.paper.venue} | {claim} | {ours} | {r['verdict']['direction']} | "
                        f"{r['verdict']['magnitude']} |")
            sections.append(section(entry, r, f"figures/reproduce/{name}.png"))
        elif entry.missing_levers() or entry.measure is None:
            rows.append(f"| `{name}` | {entry.paper.venue} | {entry.claim.value:g}× | — | waits for the "
                        f"{', '.join(entry.requires)} lever | — |")
            sections.append(waiting_section(entry))
    page.write_text(GALLERY_HEAD + "\n".join(rows) + "\n\n" + "\n".join(sections))
