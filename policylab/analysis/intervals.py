"""95 % intervals over replicates that stay inside what a metric can be, and the pairwise tests
that decide whether two configurations differ.

An interval is of the mean over a configuration's replicates (runs that differ only in seed or
trace replicate):
- a **proportion** (SLO attainment, hit rates: a share in [0, 1]) gets the Wilson score interval
  with the replicates' effective sample size (Korn & Graubard, 1998: n_eff = p(1 − p) / var(p̂),
  the replicate variance of the mean, and Student's t quantile with n − 1 degrees of freedom in
  place of z). It is Wilson's interval wherever the replicates vary as much as binomial sampling
  would, and it never leaves [0, 1]: `33.3 ± 46.8 %` becomes [1.2, 95.6] %.
- any other metric gets Student's t interval, mean ± t(0.975, n − 1) · s / √n, cut at the
  metric's limits (a latency, a rate or a count cannot be negative; Jain's index is at most 1).
  The mean cannot lie outside them, so cutting there keeps the interval's coverage.
With n = 3 replicates t(0.975, 2) = 4.30: three replicates give wide intervals.

Whether configuration B differs from A on a metric is a test of their difference, not of whether
their intervals overlap (two intervals can overlap while the difference is clearly not zero):
- **paired**: when A and B ran the same replicates (the same seed and trace replicate, so the
  same arrivals), the replicate-by-replicate differences B_k − A_k get Student's t interval;
- **bootstrap**: otherwise, the difference of the means gets a percentile bootstrap interval
  (each side resampled with replacement, 10,000 times, from a fixed seed). With few replicates a
  percentile bootstrap is optimistic; the report says which test decided each finding.
The difference is *separated* from zero when its interval excludes 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
PAIRED, BOOTSTRAP = "paired", "bootstrap"


def t_quantile(df: int) -> float:
    from scipy import stats        # (slow to import: only replicates need it)
    return float(stats.t.ppf(0.5 + CONFIDENCE / 2, df))


def finite(values) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    return v[np.isfinite(v)]


def student_t(values, limits: tuple = (-math.inf, math.inf)) -> tuple[float, float]:
    """(low, high) of the 95 % t interval of the mean, cut at `limits`; NaNs below two values."""
    v = finite(values)
    if v.size < 2:
        return math.nan, math.nan
    mean, half = v.mean(), t_quantile(v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)
    return max(mean - half, limits[0]), min(mean + half, limits[1])


def wilson_replicates(values, scale: float = 1.0) -> tuple[float, float]:
    """(low, high) of the Wilson score interval of the mean of replicate proportions given in
    [0, scale] (100 for %), with the replicates' effective sample size and a t quantile."""
    v = finite(values) / scale
    if v.size < 2:
        return math.nan, math.nan
    p, var = float(v.mean()), float(v.var(ddof=1)) / v.size
    if var <= 0 or p <= 0 or p >= 1:          # every replicate the same: nothing to widen
        return p * scale, p * scale
    n = p * (1 - p) / var
    z2 = t_quantile(v.size - 1) ** 2
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = math.sqrt(z2) / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(centre - half, 0.0) * scale, min(centre + half, 1.0) * scale


def mean_interval(values, limits: tuple, proportion: bool = False) -> tuple[float, float]:
    """The interval of a metric's replicate mean: Wilson for a proportion (`limits` = (0, scale)),
    otherwise Student t cut at `limits`."""
    return wilson_replicates(values, limits[1]) if proportion else student_t(values, limits)


@dataclass(frozen=True)
class Difference:
    """`worse` − `better` on one metric: mean, 95 % interval, the test that gave it, replicates."""
    better: str
    worse: str
    mean: float
    low: float
    high: float
    method: str            # PAIRED | BOOTSTRAP
    n: int                 # pairs (paired) or the fewer replicates of the two (bootstrap)

    @property
    def separated(self) -> bool:
        return self.low > 0 or self.high < 0


def difference(a: dict, b: dict, better: str, worse: str) -> Difference | None:
    """The difference b − a of two configurations' replicate values, each {replicate key: value}
    (finite values only): paired over their common replicates when both ran the same ones, else
    a bootstrap of the difference of means. None when either has fewer than two replicates."""
    a = {k: v for k, v in a.items() if np.isfinite(v)}
    b = {k: v for k, v in b.items() if np.isfinite(v)}
    if len(a) < 2 or len(b) < 2:
        return None
    if a.keys() == b.keys():
        d = np.array([b[k] - a[k] for k in a])
        half = t_quantile(d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
        return Difference(better, worse, float(d.mean()), float(d.mean() - half), float(d.mean() + half),
                          PAIRED, d.size)
    x, y = np.fromiter(a.values(), float), np.fromiter(b.values(), float)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    means_x = x[rng.integers(0, x.size, (BOOTSTRAP_RESAMPLES, x.size))].mean(axis=1)
    means_y = y[rng.integers(0, y.size, (BOOTSTRAP_RESAMPLES, y.size))].mean(axis=1)
    low, high = np.percentile(means_y - means_x, [50 * (1 - CONFIDENCE), 50 * (1 + CONFIDENCE)])
    return Difference(better, worse, float(y.mean() - x.mean()), float(low), float(high), BOOTSTRAP,
                      min(x.size, y.size))
