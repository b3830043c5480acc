"""Token-length distributions for generated traces: fixed, uniform, lognormal.

A lognormal is fitted to what papers report — a mean and one percentile (e.g. mean 256, p90 512)
— instead of asking for mu/sigma. Samples are whole numbers clamped to [min, max].
Spec strings (CLI): `fixed:128`, `uniform:32,512`, `lognormal:mean=256,p90=512[,max=2048]`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Optional

import numpy as np

KINDS = ("fixed", "uniform", "lognormal")


@dataclass(frozen=True)
class LengthDist:
    kind: str = "fixed"
    value: int = 128                    # fixed
    low: int = 1                        # uniform: inclusive bounds
    high: int = 128
    mean: float = 128.0                 # lognormal: mean of the (unclamped) distribution ...
    percentile: float = 90.0            # ... and its value at this percentile
    at: float = 256.0
    min: int = 1                        # clamp after sampling
    max: Optional[int] = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"length distribution must be one of {KINDS}, got '{self.kind}'")
        if self.min < 1 or (self.max is not None and self.max < self.min):
            raise ValueError(f"length bounds need 1 <= min <= max, got min={self.min}, max={self.max}")
        if self.kind == "fixed" and self.value < 1:
            raise ValueError(f"fixed length must be >= 1, got {self.value}")
        if self.kind == "uniform" and not 1 <= self.low <= self.high:
            raise ValueError(f"uniform lengths need 1 <= low <= high, got {self.low}, {self.high}")
        if self.kind == "lognormal":
            self.mu_sigma()   # fails early on an impossible mean/percentile pair

    def mu_sigma(self) -> tuple:
        """Lognormal (mu, sigma) with the given mean and percentile value.

        mean = exp(mu + s²/2) and value = exp(mu + z·s) give s² − 2·z·s + 2·ln(value/mean) = 0;
        the smallest positive root is the least skewed fit.
        """
        if not (self.mean > 0 and self.at > 0 and 0 < self.percentile < 100):
            raise ValueError(f"lognormal needs mean > 0, a value > 0 and 0 < percentile < 100, got "
                             f"mean={self.mean}, p{self.percentile:g}={self.at}")
        z = NormalDist().inv_cdf(self.percentile / 100)
        log_ratio = math.log(self.at / self.mean)
        disc = z * z - 2 * log_ratio
        roots = [] if disc < 0 else [z - math.sqrt(disc), z + math.sqrt(disc)]
        positive = [s for s in roots if s > 1e-12]
        if not positive:
            raise ValueError(f"no lognormal has mean {self.mean} and p{self.percentile:g} {self.at} "
                             f"(at p{self.percentile:g} the value can be at most "
                             f"{self.mean * math.exp(z * z / 2):.0f})")
        sigma = min(positive)
        return math.log(self.mean) - sigma * sigma / 2, sigma

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            raw = np.full(n, float(self.value))
        elif self.kind == "uniform":
            raw = rng.integers(self.low, self.high + 1, size=n).astype(float)
        else:
            mu, sigma = self.mu_sigma()
            raw = np.rint(rng.lognormal(mu, sigma, size=n))
        return np.clip(raw, self.min, self.max if self.max is not None else np.inf).astype(np.int64)

    @classmethod
    def parse(cls, spec: str) -> "LengthDist":
        """`fixed:N`, `uniform:LOW,HIGH`, `lognormal:mean=M,pNN=V[,min=A][,max=B]`."""
        kind, _, args = spec.partition(":")
        parts = [a.strip() for a in args.split(",") if a.strip()]
        try:
            if kind == "fixed" and len(parts) == 1:
                return cls("fixed", value=int(parts[0]), min=1)
            if kind == "uniform" and len(parts) == 2:
                return cls("uniform", low=int(parts[0]), high=int(parts[1]))
            if kind == "lognormal":
                if any("=" not in p for p in parts):
                    raise ValueError("lognormal arguments are key=value")
                kw = dict(p.split("=", 1) for p in parts)
                pct = [k for k in kw if k.startswith("p") and k[1:].replace(".", "", 1).isdigit()]
                if "mean" not in kw or len(pct) != 1 or set(kw) - {"mean", "min", "max", pct[0]}:
                    raise ValueError("need mean=M and one pNN=V, optional min=/max=")
                return cls("lognormal", mean=float(kw["mean"]), percentile=float(pct[0][1:]),
                           at=float(kw[pct[0]]), min=int(kw.get("min", 1)),
                           max=int(kw["max"]) if "max" in kw else None)
        except ValueError as e:
            raise ValueError(f"bad length spec '{spec}': {e}") from None
        raise ValueError(f"bad length spec '{spec}': use fixed:N, uniform:LOW,HIGH or "
                         f"lognormal:mean=M,p90=V[,max=B]")
