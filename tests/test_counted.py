"""ITL gaps kept as distinct values with counts: percentiles bit for bit numpy's on the expanded
array (the summary's numbers do not move when a million requests' gaps stop being stored)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, strategies as st

from policylab.analysis.counted import Counted, counted, mean, merge, percentiles
from policylab.analysis.metrics import QUANTILES, distribution

# few distinct values, many repeats: the shape of real gaps (one duration per step)
gaps = st.lists(st.sampled_from([0.0125, 0.0131, 0.019483, 0.02, 1e-9, 3.5, 7.123456789, 0.0, -0.0, -2.5]), min_size=1,
                max_size=400).map(np.array)
qs = st.lists(st.floats(0, 100), min_size=1, max_size=6)


@given(gaps, qs)
def test_percentiles_equal_numpy_on_the_expanded_array(x, q):
    q = list(QUANTILES.values()) + q
    assert percentiles(counted(x), q).tolist() == np.percentile(x, q).tolist()


@given(st.lists(gaps, min_size=1, max_size=5))
def test_merge_of_parts_is_the_counted_whole(parts):
    merged, whole = merge([counted(p) for p in parts]), counted(np.concatenate(parts))
    assert merged.values.tolist() == whole.values.tolist()
    assert merged.counts.tolist() == whole.counts.tolist()
    assert np.all(np.diff(merged.values) > 0)


def test_distribution_of_counted_matches_the_array_form():
    rng = np.random.default_rng(0)
    x = rng.choice(rng.uniform(0.01, 0.03, 300), size=50_000)     # 300 distinct step durations
    expected, got = distribution(x), distribution(counted(x))
    assert {k: v for k, v in got.items() if k != "mean"} == {k: v for k, v in expected.items() if k != "mean"}
    assert got["mean"] == np.float64(expected["mean"]) or abs(got["mean"] / expected["mean"] - 1) < 1e-12
    assert mean(counted(x)) > 0 and counted(x).size == x.size


def test_empty_and_nan_inputs():
    assert distribution(counted(np.array([np.nan]))) == distribution(np.array([]))
    assert merge([]).size == 0 and isinstance(merge([]), Counted)


def test_zero_and_negative_zero_are_one_value():
    """The counts hash the values' bits: -0.0 (another bit pattern) must count as 0.0."""
    c = counted(np.array([0.0, -0.0, 0.5, -0.0]))
    assert c.values.tolist() == [0.0, 0.5] and c.counts.tolist() == [3, 1]
