"""The end-of-sweep report: which jobs of a multirun completed, ended partial or failed, and why.

Jobs of a sweep never stop it (cli.hydra_job); each leaves its outcome in its own directory:
`summary.json` (status complete or partial, and the error) or `error.txt` (the job failed before
it had results). This Hydra callback reads them after the last job, whatever the launcher
(basic, joblib, submitit on a shared disk), prints one line per job that did not complete, and
exits with status 1 if any did not.
"""
from __future__ import annotations

import json
import signal
import sys
import threading
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
    """Also, in the sweep's parent: the sweep directory's lock and the stop signals passed on to
    the jobs, from the sweep's start to its end (sweep_control.py)."""

    def __init__(self):
        self._lock = self._stop = None
        self._handlers: dict = {}

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from policylab.apps.signals import STOP_SIGNALS, keep_stop_signals
        from policylab.apps.sweep_control import SweepBusy, SweepStop, lock_sweep_dir
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            self._lock = lock_sweep_dir(sweep_dir)
        except (SweepBusy, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        if threading.current_thread() is threading.main_thread():
            self._handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        keep_stop_signals()
        self._stop = SweepStop(sweep_dir).install()

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from policylab.apps.sweep_control import stop_exit_code, stop_workers, stopped_sweep
        stop_workers()                          # no idle worker outlives the sweep
        sweep_dir = Path(config.hydra.sweep.dir)
        stopped = stopped_sweep(sweep_dir)
        self._release()
        if not sweep_dir.is_dir():
            return
        outcomes = job_outcomes(sweep_dir)
        bad = [o for o in outcomes if o[1] != "complete"]
        print(f"sweep {sweep_dir}: {len(outcomes)} jobs, {len(outcomes) - len(bad)} complete"
              + (f", {len(bad)} did not complete:" if bad else ""), file=sys.stderr)
        for name, status, error in bad:
            print(f"  {name} [{overrides_of(sweep_dir / name)}]: {status}: {error}", file=sys.stderr)
        if stopped:
            print(f"sweep stopped by {stopped}", file=sys.stderr)
            raise SystemExit(stop_exit_code(stopped))
        if bad:
            raise SystemExit(1)

    def _release(self) -> None:
        if self._stop is not None:
            self._stop.remove()
        for sig, handler in self._handlers.items():
            signal.signal(sig, handler)
        if self._lock is not None:
            self._lock.close()
        self._lock = self._stop = None
        self._handlers = {}
