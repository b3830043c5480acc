"""A sweep's parent process: one sweep per directory, and a stop signal that reaches every job.

Two multiruns writing into one `hydra.sweep.dir` would overwrite each other's job directories
(`0_chunked_poisson` of the one set aside as `*.previous.*` by the other): the parent holds a
lock on the directory for the whole sweep, and a second sweep is refused naming the first.

A stop signal to the parent (SIGTERM from `timeout` or `docker stop`, Ctrl-C) marks the sweep
stopped (`STOP_MARKER` in its directory) and is passed on to the launcher's worker processes:
each running job ends its replay and writes its partial results, no job starts after it
(`skipped_by_stop`), the sweep report prints, and no worker outlives the parent.
"""
from __future__ import annotations

import atexit
import fcntl
import os
import signal
import sys
from pathlib import Path

from policylab.apps.signals import on_stop, signal_name

LOCK_FILE = ".sweep.lock"
STOP_MARKER = ".sweep-stopped"


class SweepBusy(Exception):
    """Another sweep writes into this directory."""


def lock_sweep_dir(sweep_dir: Path):
    """An open, exclusively locked file in `sweep_dir` (closed: unlocked, also when the process dies)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    f = open(sweep_dir / LOCK_FILE, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "?"
        f.close()
        raise SweepBusy(f"another sweep (process {holder}) is writing into {sweep_dir}: wait for it, or give "
                        f"this one its own hydra.sweep.dir") from None
    f.truncate(0)
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def worker_pids() -> list:
    """The joblib (loky) worker processes of this process, if it has any."""
    try:
        from joblib.externals.loky import reusable_executor
    except ImportError:
        return []
    executor = reusable_executor._executor
    return list(getattr(executor, "_processes", {}) or {}) if executor is not None else []


def stop_workers() -> None:
    """End the launcher's idle workers now (a loky executor keeps them for reuse otherwise)."""
    try:
        from joblib.externals.loky import reusable_executor
    except ImportError:
        return
    executor = reusable_executor._executor
    if executor is not None:
        executor.shutdown(wait=True, kill_workers=True)


class SweepStop:
    """While installed: the parent's stop signals mark the sweep stopped and reach the workers."""

    def __init__(self, sweep_dir: Path):
        self.marker = Path(sweep_dir) / STOP_MARKER
        self.marker.unlink(missing_ok=True)          # (an earlier, stopped sweep's)

    def __call__(self, signum: int, first: bool) -> None:
        if not first:
            return
        mark_stopped(self.marker, signum)
        pids = worker_pids()
        for pid in pids:
            try:
                os.kill(pid, signum)
            except OSError:
                pass
        try:
            print(f"{signal_name(signum)} received: stopping the sweep; running jobs write their partial "
                  f"results{f' ({len(pids)} workers told)' if pids else ''}, the others do not start",
                  file=sys.stderr, flush=True)
        except OSError:
            pass

    def install(self) -> "SweepStop":
        on_stop.append(self)
        atexit.register(stop_workers)
        return self

    def remove(self) -> None:
        if self in on_stop:
            on_stop.remove(self)


def mark_stopped(marker: Path, signum: int) -> None:
    try:
        marker.write_text(signal_name(signum) + "\n")
    except OSError:
        pass


def stopped_sweep(sweep_dir: Path) -> str | None:
    """The signal that stopped the sweep in `sweep_dir` (its name), or None."""
    try:
        return (Path(sweep_dir) / STOP_MARKER).read_text().strip() or "SIGTERM"
    except OSError:
        return None


def stop_exit_code(name: str) -> int:
    return 128 + int(getattr(signal, name, signal.SIGTERM))
