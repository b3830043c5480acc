"""Signals that end a job (SIGINT, SIGTERM, SIGHUP) stop the replay the way Ctrl-C does, and
never interrupt the writing of its results.

`timeout`, `docker stop`, Slurm preemption and a closed terminal send SIGTERM or SIGHUP, whose
default action kills the process with nothing written. While a replay runs, the first of these
signals raises `KeyboardInterrupt` (the engine ends the run, marked partial); from then on, and
while results are written (`shield()`), later signals are noted and ignored, so a second Ctrl-C
cannot cut a results file in half. The job then exits with 128 + the signal's number, as a shell
reports a process killed by it.

A policy that swallows the `KeyboardInterrupt` (`except: pass` around a loop) would keep the
replay running forever: a later signal (at least `ESCALATE_AFTER_S` after the first, so one
Ctrl-C that reaches a process twice does not count) or `STOP_GRACE_S` without the engine
returning writes the results from the handler (`stuck_writer`) and ends the process (where
there is no writer, a cluster's replay, only the later signal ends it, without results).

Outside a replay (`keep_stop_signals`), a stop signal is noted, never fatal: the next replay
does not start, and a sweep's parent tells its running jobs (`on_stop`).

The deadline borrows SIGALRM only while it is set: an alarm someone else armed before the replay
(a test's time limit, pytest-timeout's signal method) still reaches its own handler, and its
timer runs on after the replay with the time it had left.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
ESCALATE_AFTER_S = 1.0      # a later signal this long after the first: the replay did not stop
STOP_GRACE_S = 20.0         # the engine gets this long to return after the first signal

_noted: list = []           # stop signals this process got outside a replay, in order
on_stop: list = []          # callables(signum, first: bool) run for each of them


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def _stop_error(signum: int) -> KeyboardInterrupt:
    return KeyboardInterrupt() if signum == signal.SIGINT else KeyboardInterrupt(signal_name(signum))


def _say(text: str) -> None:
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:
        pass                    # (after SIGHUP the terminal may be gone)


def _note(signum: int, frame) -> None:
    first = not _noted
    _noted.append(signum)
    for callback in list(on_stop):
        callback(signum, first)


def keep_stop_signals() -> None:
    """From now until the process ends, a stop signal outside a replay is noted (`noted_stop`)
    instead of killing the process or raising in whatever code runs."""
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, _note)


def default_stop_signals() -> None:
    """Ctrl-C raises KeyboardInterrupt and SIGTERM/SIGHUP end the process, as in any program."""
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)


def noted_stop() -> int | None:
    """The first stop signal noted outside a replay, or None."""
    return _noted[0] if _noted else None


class ReplaySignals:
    """Context manager: raise on the first stop signal while `armed`, note the others."""

    def __init__(self):
        self.received: list = []      # signal numbers, in order
        self.armed = True
        self.stopping = False         # the first signal was raised into the replay
        self.shielded = False         # the replay returned: results are being written
        self.stuck_writer = None      # callable(signum): writes the results if the replay never returns
        self._first_at = 0.0
        self._previous: dict = {}
        self._outer_alarm = (0.0, 0.0)   # (seconds left, when read) of an alarm armed before the replay
        self._deadline_set = False

    def __enter__(self) -> "ReplaySignals":
        if threading.current_thread() is threading.main_thread():   # (handlers: main thread only)
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
            if hasattr(signal, "SIGALRM"):
                self._outer_alarm = (signal.getitimer(signal.ITIMER_REAL)[0], time.monotonic())
                self._previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._deadline)
        if _noted:                    # stopped before this replay began: it does not start
            self.received.append(_noted[0])
            self.__exit__()
            raise _stop_error(_noted[0])
        return self

    def __exit__(self, *exc) -> None:
        self._cancel_deadline()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        self.received.append(signum)
        if self.armed:
            self.armed = False
            if not self.shielded and not self.stopping:
                self.stopping, self._first_at = True, time.monotonic()
                if hasattr(signal, "setitimer"):
                    signal.setitimer(signal.ITIMER_REAL, STOP_GRACE_S)
                    self._deadline_set = True
            raise _stop_error(signum)
        if self.stopping and not self.shielded and time.monotonic() - self._first_at >= ESCALATE_AFTER_S:
            self._write_now(f"{signal_name(signum)} after {signal_name(self.received[0])}")
        _say(f"{signal_name(signum)} received: finishing the results files first")

    def _deadline(self, signum: int, frame) -> None:
        if not self._deadline_set:              # an alarm armed before the replay: its owner's
            outer = self._previous.get(signal.SIGALRM)
            if callable(outer):
                outer(signum, frame)
            return
        if self.stopping and not self.shielded and self.stuck_writer is not None:
            self._write_now(f"{STOP_GRACE_S:g} s after {signal_name(self.received[0])}")

    def _write_now(self, why: str) -> None:
        """The replay did not return after the stop (a policy swallowed it): write what there is
        and end the process here, since any exception raised would be swallowed too."""
        writer, code = self.stuck_writer, 128 + self.received[0]
        self.shield()
        try:
            if writer is not None:
                writer(why)
            else:
                _say(f"the replay did not stop after {signal_name(self.received[0])} ({why}): ending it "
                     "without writing its results")
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(code)

    def _cancel_deadline(self) -> None:
        """Disarm the deadline, if set, and give an alarm armed before the replay what it had left."""
        if not self._deadline_set or threading.current_thread() is not threading.main_thread():
            return
        self._deadline_set = False
        left, read_at = self._outer_alarm
        signal.setitimer(signal.ITIMER_REAL, max(left - (time.monotonic() - read_at), 1e-3) if left > 0 else 0)

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
                self.stopping, self._first_at = True, time.monotonic()
                raise _stop_error(self.received[before])

    def shield(self) -> None:
        """From now on signals are only noted: results are being written."""
        self.armed, self.shielded, self.stuck_writer = False, True, None
        self._cancel_deadline()

    def rearm(self) -> None:
        """The results are written: a stop signal now raises again, to end what comes after them
        (plots, W&B logging) early."""
        if not self.received:
            self.armed = True

    @property
    def stopped_by(self) -> int | None:
        """The first stop signal received, or None."""
        return self.received[0] if self.received else None

    def exit_code(self) -> int:
        return 128 + self.stopped_by if self.stopped_by else 0
