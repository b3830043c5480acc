"""Replay clocks (DESIGN §5): virtual time for deterministic replays, wall time for live ones."""
from __future__ import annotations

import time


class VirtualClock:
    """Advances only by step durations; jumps over idle gaps. Deterministic."""

    def __init__(self):
        self.now = 0.0

    def start_step(self) -> None:
        pass

    def advance(self, duration: float) -> None:
        self.now += duration

    def idle_until(self, t: float) -> None:
        if t > self.now:
            self.now = t


class WallClock:
    """Real time since start; a simulated step is slept out so arrivals keep real pacing."""

    def __init__(self):
        self._t0 = time.perf_counter()
        self._step_start = 0.0
        self.now = 0.0

    def _read(self) -> float:
        return time.perf_counter() - self._t0

    def start_step(self) -> None:
        self._step_start = self.now = self._read()

    def advance(self, duration: float) -> None:
        late = self._step_start + duration - self._read()
        if late > 0:
            time.sleep(late)
        self.now = self._read()

    def idle_until(self, t: float) -> None:
        wait = t - self._read()
        if wait > 0:
            time.sleep(wait)
        self.now = self._read()


def make_clock(kind: str):
    clocks = {"virtual": VirtualClock, "wall": WallClock}
    if kind not in clocks:
        raise ValueError(f"engine.clock must be one of {sorted(clocks)}, got '{kind}'")
    return clocks[kind]()
