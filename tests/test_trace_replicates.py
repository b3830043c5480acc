"""trace.replicate and trace.repeat: what a replicate varies and keeps, and what tiling does."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from policylab.traces import TraceError, load_trace
from policylab.traces.config import TraceConfig

MULTITENANT = TraceConfig(name="multitenant", path="traces/multitenant.jsonl", prefix_block_tokens=64)


def test_replicate_zero_is_the_trace_and_replicates_differ_but_keep_count_mix_and_rate():
    base = load_trace(MULTITENANT)
    assert load_trace(replace(MULTITENANT, replicate=0)) == base
    one, two = (load_trace(replace(MULTITENANT, replicate=k)) for k in (1, 2))
    assert one == load_trace(replace(MULTITENANT, replicate=1)), "a replicate is reproducible"
    assert one != base and two != base and one != two
    for r in (one, two):
        assert len(r) == len(base)
        times = [t.arrival_time for t in r]
        assert times == sorted(times) and times[0] == 0.0
        assert times[-1] == pytest.approx(base[-1].arrival_time, rel=0.35)      # same mean rate, roughly
        share = Counter(t.client for t in r)
        for client, n in Counter(t.client for t in base).items():
            assert share[client] == pytest.approx(n, rel=0.5, abs=10)
        assert set((t.prompt_tokens, t.output_tokens, t.ttft_slo) for t in r) <= \
            set((t.prompt_tokens, t.output_tokens, t.ttft_slo) for t in base)   # requests are the trace's


def test_replicate_depends_on_the_seed_too():
    assert load_trace(replace(MULTITENANT, replicate=1), seed=0) != load_trace(replace(MULTITENANT, replicate=1), seed=1)


def test_repeat_tiles_the_trace_one_mean_gap_apart():
    base = load_trace(MULTITENANT)
    tiled = load_trace(replace(MULTITENANT, repeat=3))
    times = np.array([t.arrival_time for t in base])
    period = times[-1] + times[-1] / (len(times) - 1)
    assert len(tiled) == 3 * len(base)
    assert [t.arrival_time for t in tiled[len(base):2 * len(base)]] == pytest.approx(list(times + period))
    assert [t.prompt_tokens for t in tiled[-len(base):]] == [t.prompt_tokens for t in base]


@pytest.mark.parametrize("field, value", [("replicate", -1), ("repeat", 0)])
def test_bad_replicate_or_repeat_names_the_field(field, value):
    with pytest.raises(TraceError, match=f"trace.{field}"):
        load_trace(replace(MULTITENANT, **{field: value}))
