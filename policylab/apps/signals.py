"""Signals that end a job (SIGINT, SIGTERM, SIGHUP) stop the replay the way Ctrl-C does, and
never interrupt the writing of its results.

`timeout`, `docker stop`, Slurm preemption and a closed terminal send SIGTERM or SIGHUP, whose
default action kills the process with nothing written. While a replay runs, the first of these
signals raises `KeyboardInterrupt` (the engine ends the run, marked partial); from then on, and
while results are written (`shield()`), later signals are noted and ignored, so a second Ctrl-C
cannot cut a results file in half. The job then exits with 128 + the signal's number, as a shell
reports a process killed by it.
"""
from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class ReplaySignals:
    """Context manager: raise on the first stop signal while `armed`, note the others."""

    def __init__(self):
        self.received: list = []      # signal numbers, in order
        self.armed = True
        self._previous: dict = {}

    def __enter__(self) -> "ReplaySignals":
        if threading.current_thread() is threading.main_thread():   # (handlers: main thread only)
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        self.received.append(signum)
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt() if signum == signal.SIGINT else KeyboardInterrupt(signal.Signals(signum).name)
        try:
            print(f"{signal.Signals(signum).name} received: finishing the results files first",
                  file=sys.stderr, flush=True)
        except OSError:
            pass                    # (after SIGHUP the terminal may be gone)

    @contextmanager
    def held(self):
        """While inside, stop signals are only noted (a results row group is being written); the
        first one is raised on leaving, if the replay was still running."""
        if not self.armed:
            yield
            return
        self.armed, before = False, len(self.received)
        try:
            yield
        finally:
            self.armed = len(self.received) == before
            if not self.armed:
                signum = self.received[before]
                raise KeyboardInterrupt() if signum == signal.SIGINT else KeyboardInterrupt(signal.Signals(signum).name)

    def shield(self) -> None:
        """From now on signals are only noted: results are being written."""
        self.armed = False

    @property
    def stopped_by(self) -> int | None:
        """The first stop signal received, or None."""
        return self.received[0] if self.received else None

    def exit_code(self) -> int:
        return 128 + self.stopped_by if self.stopped_by else 0
