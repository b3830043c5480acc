"""Published scheduling results, replayed: `python -m policylab reproduce NAME | all | --list`, and
`policylab.reproduce(NAME)` from Python.

Each entry replays one paper's headline setting as closely as public data allows (every
substitution written down), over replicates with 95 % intervals, and sets the paper's number
beside the replay's with a verdict on direction and magnitude (docs/reproductions.md).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from policylab.apps.jobs import RunError

DEFAULT_REPLICATES = 3


@dataclass
class Reproduction:
    """One entry's reproduction: its result (`result.json` as a dict) and where its files are."""
    name: str
    dir: Path
    result: dict

    @property
    def verdict(self) -> dict:
        return self.result["verdict"]

    @property
    def comparisons(self) -> list:
        return self.result["comparisons"]

    @property
    def figure(self) -> Path:
        return self.dir / "figure.png"


def catalog() -> dict:
    """name -> Entry, in gallery order (the entries are modules of `policylab.apps.reproduce.entries`)."""
    from policylab.apps.reproduce.entries import catalog as entries
    return entries()


def reproduce(name: str, replicates: int = DEFAULT_REPLICATES, out: Optional[str | Path] = None,
              quick: bool = False, log=None) -> Reproduction:
    """Run one entry (`catalog()` lists them) and return its Reproduction; the files go to `out`
    (default: reproductions/NAME). `quick` runs the entry's small version (its test's). `log`
    takes the progress lines (default: stderr). Prints the paper's claim beside the replay's
    numbers. An entry that waits for a lever raises RunError naming it."""
    from policylab.apps.reproduce.report import printout, source_commit, write
    from policylab.apps.reproduce.runner import Context
    known = catalog()
    if name not in known:
        raise RunError(f"reproduce: no entry '{name}' (entries: {', '.join(known)})")
    entry = known[name]
    missing = entry.missing_levers()
    if missing or entry.measure is None:
        raise RunError(f"reproduce {name}: waits for the {', '.join(missing or entry.requires)} lever, which this "
                       f"engine does not have yet; planned: {entry.planned}")
    out_dir = Path(out) if out is not None else Path("reproductions") / name
    ctx = Context(name, out_dir, replicates, quick, log)
    started = time.perf_counter()
    outcome = entry.measure(ctx)
    seconds = time.perf_counter() - started
    ctx.write_runs()
    result = write(entry, outcome, out_dir, seconds, source_commit(), replicates, quick)
    print(printout(entry, outcome, seconds, out_dir), flush=True)
    return Reproduction(name, out_dir, result)
