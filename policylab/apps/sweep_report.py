"""The end-of-sweep report: which jobs of a multirun completed, ended partial or failed, and why.

Jobs of a sweep never stop it (cli.hydra_job); each leaves its outcome in its own directory:
`summary.json` (status complete or partial, and the error) or `error.txt` (the job failed before
it had results). This Hydra callback reads them after the last job, whatever the launcher
(basic, joblib, submitit on a shared disk), prints one line per job that did not complete, and
exits with status 1 if any did not.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


def job_outcomes(sweep_dir: Path) -> list:
    """(job directory name, status, error) for every job directory of a sweep, in job order."""
    outcomes = []
    for job_dir in sorted((d for d in Path(sweep_dir).iterdir() if (d / ".hydra").is_dir()),
                          key=lambda d: (int(d.name.split("_")[0]) if d.name.split("_")[0].isdigit() else 1 << 30,
                                         d.name)):
        summary, error = job_dir / "summary.json", job_dir / "error.txt"
        if error.is_file():
            outcomes.append((job_dir.name, "failed", error.read_text().strip()))
        elif summary.is_file():
            try:
                data = json.loads(summary.read_text())
                outcomes.append((job_dir.name, data.get("status", "?"), data.get("error") or ""))
            except (OSError, ValueError) as e:
                outcomes.append((job_dir.name, "failed", f"unreadable summary.json: {e}"))
        elif any(job_dir.glob("*.json")) or any(job_dir.glob("*.csv")):   # capacity, calibrate, fidelity
            outcomes.append((job_dir.name, "complete", ""))
        else:
            outcomes.append((job_dir.name, "failed", "no results and no error message (killed?)"))
    return outcomes


def overrides_of(job_dir: Path) -> str:
    try:
        lines = (job_dir / ".hydra" / "overrides.yaml").read_text().splitlines()
    except OSError:
        return ""
    return " ".join(line[2:] for line in lines if line.startswith("- "))


class SweepReport(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        outcomes = job_outcomes(sweep_dir)
        bad = [o for o in outcomes if o[1] != "complete"]
        print(f"sweep {sweep_dir}: {len(outcomes)} jobs, {len(outcomes) - len(bad)} complete"
              + (f", {len(bad)} did not complete:" if bad else ""), file=sys.stderr)
        for name, status, error in bad:
            print(f"  {name} [{overrides_of(sweep_dir / name)}]: {status}: {error}", file=sys.stderr)
        if bad:
            raise SystemExit(1)
