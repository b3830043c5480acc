"""Replicates into a number with a 95 % interval, and the verdict of a replay against a paper.

A reproduction measures each quantity once per replicate (an independently drawn workload, or a
bootstrap resample of a public trace), the arms of one replicate on the same requests. So:

- a plain quantity is the replicates' mean with a two-sided 95 % Student-t interval
  (mean ± t(0.975, n−1) · s / √n);
- a ratio between two arms is paired: one ratio per replicate, pooled as a geometric mean with
  the t-interval taken on the log ratios (a ratio of 2 and one of 1/2 average to 1, not 1.25);
- with one replicate the interval is the point itself (n = 1 says so).

The verdict compares the replay's headline ratio with the paper's: the *direction* holds when
the whole interval lies on the paper's side of 1 (`holds`), when only the mean does (`holds,
within noise`), else it does not; the *magnitude* is within 2× of the paper's number when
paper/2 ≤ ours ≤ 2·paper.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

CONFIDENCE = 0.95
WITHIN = 2.0                   # the magnitude target: within this factor of the paper's number


def t_quantile(n: int) -> float:
    """t(0.975, n − 1): the half-width multiplier of a 95 % interval over n replicates."""
    from scipy import stats           # (slow to import: only a finished reproduction needs it)
    return float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1))


@dataclass
class Measure:
    """One quantity over the replicates: `values` (one per replicate) and how they pool."""
    label: str
    unit: str
    values: list
    geometric: bool = False            # a ratio: pooled on the log scale
    mean: float = field(init=False)
    low: float = field(init=False)
    high: float = field(init=False)

    def __post_init__(self):
        v = [float(x) for x in self.values if x is not None and math.isfinite(float(x))]
        if self.geometric:
            v = [x for x in v if x > 0]
        if not v:
            self.mean = self.low = self.high = math.nan
            return
        data = [math.log(x) for x in v] if self.geometric else v
        mean = sum(data) / len(data)
        half = 0.0
        if len(data) > 1:
            sd = math.sqrt(sum((x - mean) ** 2 for x in data) / (len(data) - 1))
            half = t_quantile(len(data)) * sd / math.sqrt(len(data))
        lo, hi = mean - half, mean + half
        if self.geometric:
            mean, lo, hi = math.exp(mean), math.exp(lo), math.exp(hi)
        self.mean, self.low, self.high = mean, lo, hi

    @property
    def n(self) -> int:
        return sum(1 for x in self.values if x is not None and math.isfinite(float(x)))

    def text(self, digits: int = 2) -> str:
        """`2.61× [2.30, 2.95]` or `0.84 [0.80, 0.88] s`; `—` when nothing was measured."""
        if not math.isfinite(self.mean):
            return "—"
        unit = "×" if self.unit == "x" else (f" {self.unit}" if self.unit else "")
        if self.n < 2:
            return f"{self.mean:.{digits}f}{unit} (n = 1)"
        return f"{self.mean:.{digits}f}{unit} [{self.low:.{digits}f}, {self.high:.{digits}f}]"

    def as_dict(self) -> dict:
        clean = lambda x: x if math.isfinite(x) else None      # noqa: E731 (JSON has no NaN)
        return {"label": self.label, "unit": self.unit, "values": [clean(float(x)) if x is not None else None
                                                                   for x in self.values],
                "mean": clean(self.mean), "low": clean(self.low), "high": clean(self.high), "n": self.n,
                "geometric": self.geometric}


def ratio(label: str, treated: list, baseline: list) -> Measure:
    """Paired ratio treated / baseline per replicate, pooled geometrically (a zero or missing
    baseline leaves that replicate out)."""
    values = [t / b if (t is not None and b) else None for t, b in zip(treated, baseline)]
    return Measure(label, "x", values, geometric=True)


@dataclass(frozen=True)
class Verdict:
    direction: str              # holds | holds, within noise | does not hold | not measured
    magnitude: str              # e.g. "within 2× (0.9× the paper's)" or "3.1× below the paper's"
    reason: str = ""            # why, in one or two sentences (written by the entry)

    def as_dict(self) -> dict:
        return {"direction": self.direction, "magnitude": self.magnitude, "reason": self.reason}


def direction(m: Measure, paper_above_one: bool = True) -> str:
    """Whether the replay's ratio lies on the paper's side of 1 (above, for a gain)."""
    if not math.isfinite(m.mean):
        return "not measured"
    side = (lambda x: x > 1.0) if paper_above_one else (lambda x: x < 1.0)
    if not side(m.mean):
        return "does not hold"
    bound = m.low if paper_above_one else m.high
    return "holds" if (m.n > 1 and side(bound)) else "holds, within noise"


def overall(directions: list) -> str:
    """One direction for several comparisons: the common one, else the weakest."""
    order = ("does not hold", "not measured", "holds, within noise", "holds")
    return min(directions, key=order.index) if directions else "not measured"


def magnitude(ours: float, paper: float | None, matched: bool = True) -> str:
    """How far the replay's number is from the paper's, as a factor; `matched=False` says the
    setting differs enough that the factor is not a test of the paper's number."""
    if paper is None or not math.isfinite(ours) or ours <= 0:
        return "no number to compare"
    factor = ours / paper
    if 1 / WITHIN <= factor <= WITHIN:
        text = f"within {WITHIN:g}× ({factor:.2f}× the paper's)"
    elif factor < 1:
        text = f"{1 / factor:.1f}× below the paper's"
    else:
        text = f"{factor:.1f}× above the paper's"
    return text if matched else f"{text}; the setting differs, so this is not a test of the paper's number"
