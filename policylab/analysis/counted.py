"""Exact distributions of many repeated values, kept as sorted distinct values with counts.

A million-request replay pools ~2e8 inter-token gaps, but only about one distinct gap per
step: every request that decoded in the step before waits exactly this step's duration. As
a float64 array the gaps take 1.7 GB; as (distinct value, count) pairs about 40 MB. The
percentiles are numpy's default (linear) method on the expanded array, bit for bit: the
same virtual index, the same two neighbours, the same interpolation formula (tested against
`np.percentile`). The mean is the count-weighted sum over the count, equal to the expanded
array's mean to float rounding.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd


class Counted(NamedTuple):
    values: np.ndarray      # float64, sorted ascending, distinct, no NaN
    counts: np.ndarray      # int64 > 0, one per value

    @property
    def size(self) -> int:
        """How many values the expanded array holds."""
        return int(self.counts.sum())


def counted(x: np.ndarray) -> Counted:
    """The distinct values of `x` (float64, NaN dropped) with how often each occurs: counted in a
    hash table, then only the distinct values sorted (np.unique sorts all of them). The table
    hashes the values' bits (cheaper than hashing floats), once -0.0 is made 0.0: then equal
    values are equal bits."""
    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)] + 0.0
    tally = pd.Series(x.view(np.int64)).value_counts(sort=False)
    values = tally.index.to_numpy(dtype=np.int64).view(np.float64)
    order = np.argsort(values)
    return Counted(values[order], tally.to_numpy(dtype=np.int64)[order])


def merge(parts: list) -> Counted:
    """One Counted holding every value of `parts` (counts of equal values added)."""
    if not parts:
        return Counted(np.zeros(0), np.zeros(0, dtype=np.int64))
    values = np.concatenate([p.values for p in parts])
    counts = np.concatenate([p.counts for p in parts])
    order = np.argsort(values, kind="stable")
    values, counts = values[order], counts[order]
    if not values.size:
        return Counted(values, counts)
    starts = np.flatnonzero(np.concatenate([[True], values[1:] != values[:-1]]))
    return Counted(values[starts], np.add.reduceat(counts, starts))


def percentiles(c: Counted, q: list) -> np.ndarray:
    """`np.percentile(expanded, q)` (method 'linear') without expanding: for each quantile the
    virtual index (n - 1) * q, its floor and the next order statistic, then numpy's lerp."""
    n = c.size
    quantiles = np.true_divide(np.asarray(q, dtype=np.float64), 100)
    virtual = (n - 1) * quantiles
    previous = np.floor(virtual)
    above = virtual >= n - 1                       # numpy takes the largest value there
    lo = np.where(above, n - 1, previous).astype(np.int64)
    hi = np.where(above, n - 1, previous + 1).astype(np.int64)
    gamma = virtual - np.where(above, -1, previous)
    ends = np.cumsum(c.counts)                      # order statistic k is values[first end > k]
    a = c.values[np.searchsorted(ends, lo, side="right")]
    b = c.values[np.searchsorted(ends, hi, side="right")]
    diff = b - a
    return np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)


def mean(c: Counted) -> float:
    return float(np.dot(c.values, c.counts.astype(np.float64)) / c.size)
