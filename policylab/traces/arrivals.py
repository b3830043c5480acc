"""Arrival processes for generated traces: Poisson, gamma (burstiness = CV), on/off MMPP.

Every process returns `n` sorted arrival times in seconds from t = 0 (the first arrival comes
after one gap, so merged clients do not all start at once), drawn from the caller's seeded numpy
Generator (same seed → same times).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("poisson", "gamma", "bursty")


@dataclass(frozen=True)
class ArrivalProcess:
    kind: str = "poisson"
    rate: float = 1.0            # poisson / gamma: mean requests per second
    cv: float = 1.0              # gamma: coefficient of variation of inter-arrival times (1 = Poisson)
    on_rate: float = 20.0        # bursty: requests/s while in a burst ...
    off_rate: float = 1.0        # ... and while quiet
    on_duration: float = 2.0     # bursty: mean sojourn (s) in the burst state ...
    off_duration: float = 8.0    # ... and in the quiet state (both exponential)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"arrival process must be one of {KINDS}, got '{self.kind}'")
        positive = {"rate": self.rate, "cv": self.cv, "on_duration": self.on_duration,
                    "off_duration": self.off_duration, "on_rate": self.on_rate}
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"arrival {name} must be > 0, got {value}")
        if self.off_rate < 0:
            raise ValueError(f"arrival off_rate must be >= 0, got {self.off_rate}")

    @property
    def mean_rate(self) -> float:
        if self.kind != "bursty":
            return self.rate
        total = self.on_duration + self.off_duration
        return (self.on_rate * self.on_duration + self.off_rate * self.off_duration) / total

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "bursty":
            times = _mmpp(rng, n, self)
        else:
            if self.kind == "poisson":
                gaps = rng.exponential(1.0 / self.rate, size=n)
            else:
                shape = 1.0 / self.cv ** 2
                gaps = rng.gamma(shape, 1.0 / (self.rate * shape), size=n)
            times = np.cumsum(gaps)
        return times


def _mmpp(rng: np.random.Generator, n: int, p: ArrivalProcess) -> np.ndarray:
    """Two-state Markov-modulated Poisson process: exponential sojourns, Poisson arrivals inside.

    Starts in a state drawn from the stationary distribution; within a sojourn of length d at rate
    r the arrival count is Poisson(r·d) and their times are uniform (memorylessness).
    """
    on = rng.random() < p.on_duration / (p.on_duration + p.off_duration)
    t, chunks, count = 0.0, [], 0
    while count < n:
        d = rng.exponential(p.on_duration if on else p.off_duration)
        k = rng.poisson((p.on_rate if on else p.off_rate) * d)
        if k:
            chunks.append(np.sort(t + rng.random(k) * d))
            count += k
        t, on = t + d, not on
    return np.concatenate(chunks)[:n] if chunks else np.zeros(0)
