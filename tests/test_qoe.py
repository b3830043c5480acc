"""Andes' quality of experience (policylab/analysis/qoe.py): the definition by hand, the whole-table
computation against it, and QoE in a run's requests and summary."""
from __future__ import annotations

import numpy as np
import pytest

from policylab.analysis.metrics import flat_token_times
from policylab.analysis.qoe import _running_max, check_qoe_config, qoe_of, request_qoe
from policylab.core.config import QoeConfig

pytestmark = pytest.mark.timeout(120)
CFG = QoeConfig(ttft=1.0, tds=5.0)        # a token every 0.2 s after a 1 s first token


def on_pace(n: int, delay: float = 0.0, start: float = 0.0) -> list:
    return [start + CFG.ttft + delay + i / CFG.tds for i in range(n)]


def test_tokens_on_or_ahead_of_the_reader_score_one():
    assert qoe_of(on_pace(10), 0.0, CFG) == pytest.approx(1.0)
    assert qoe_of([0.1 + 0.01 * i for i in range(10)], 0.0, CFG) == pytest.approx(1.0)   # early is no better


def test_a_late_first_token_costs_as_derived():
    # every token D late: QoE = 1 / (1 + 2·tds·D / (n + 1))
    for n, delay in ((1, 0.5), (10, 2.0), (200, 10.0)):
        expected = 1.0 / (1.0 + 2 * CFG.tds * delay / (n + 1))
        assert qoe_of(on_pace(n, delay, start=3.0), 3.0, CFG) == pytest.approx(expected)


def test_a_stall_costs_the_tokens_read_late_by_hand():
    # 4 tokens: on time at 1.0 and 1.2, then a stall: the third arrives at 2.4, the fourth with it
    times = [1.0, 1.2, 2.4, 2.4]
    read = [1.0, 1.2, 2.4, 2.6]                       # the fourth is read one pace after the third
    end = read[-1] + 0.2
    expected = sum(end - m for m in read) / sum(end - e for e in (1.0, 1.2, 1.4, 1.6))
    assert qoe_of(times, 0.0, CFG) == pytest.approx(expected)
    assert expected < 1.0


def test_the_whole_table_equals_the_definition_request_by_request():
    rng = np.random.default_rng(0)
    token_times, arrival = [], []
    for _ in range(300):
        a = float(rng.uniform(0, 50))
        n = int(rng.integers(1, 60))
        first = a + float(rng.exponential(2.0))
        token_times.append(list(first + np.cumsum(np.r_[0.0, rng.exponential(0.15, n - 1)])))
        arrival.append(a)
    token_times.append([])                                  # rejected: no token
    arrival.append(10.0)
    status = np.array(["finished"] * 300 + ["rejected"])
    times, rows = flat_token_times(token_times)
    got = request_qoe(times, rows, np.array(arrival), status, CFG)
    want = [qoe_of(t, a, CFG) for t, a in zip(token_times[:-1], arrival[:-1])]
    np.testing.assert_allclose(got[:-1], want, rtol=1e-9, atol=1e-12)
    assert got[-1] == 0.0
    assert ((got >= 0) & (got <= 1)).all()


def test_the_running_maximum_restarts_at_every_stream_exactly():
    rng = np.random.default_rng(3)
    count = rng.integers(0, 40, 200)
    count[::7] = 0                                     # streams with no token between others
    first = np.concatenate([[0], np.cumsum(count)[:-1]])
    values = rng.standard_normal(int(count.sum()))
    expected = np.concatenate([np.maximum.accumulate(values[f:f + c]) for f, c in zip(first, count) if c])
    assert np.array_equal(_running_max(values, first, count), expected)
    assert _running_max(np.zeros(0), np.zeros(3, int), np.zeros(3, int)).size == 0


def test_streams_that_never_exceed_their_first_entry_and_streams_that_do_mix_exactly():
    """Tokens arriving faster than the reading pace keep the first token's lateness throughout
    (the one-pass case); a stall makes a later token the maximum (the per-place passes)."""
    rng = np.random.default_rng(5)
    count = rng.integers(1, 50, 300)
    first = np.concatenate([[0], np.cumsum(count)[:-1]])
    values = np.concatenate([np.sort(rng.standard_normal(c))[::-1] for c in count])   # falling
    stalled = rng.random(300) < 0.3
    for f, c in zip(first[stalled], count[stalled]):
        values[f + rng.integers(0, c)] += 10.0                                        # a stall
    expected = np.concatenate([np.maximum.accumulate(values[f:f + c]) for f, c in zip(first, count)])
    assert np.array_equal(_running_max(values, first, count), expected)


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match="qoe.tds"):
        check_qoe_config(QoeConfig(ttft=1.0, tds=0.0))
    with pytest.raises(ValueError, match="qoe.ttft"):
        check_qoe_config(QoeConfig(ttft=-1.0, tds=5.0))


def test_a_replay_has_qoe_per_request_and_in_its_summary():
    from policylab.analysis.result_files import ResultSettings
    from policylab.analysis.results import summarize_run
    from policylab.core.config import EngineConfig
    from policylab.core.request import TraceRequest
    from policylab.testing.replay import replay
    trace = [TraceRequest(0.1 * i, 64, 32) for i in range(20)]
    result, _ = replay("chunked", trace, EngineConfig(max_num_seqs=4, num_blocks=64, block_size=16))
    requests, _, summary = summarize_run(result, ResultSettings(qoe=QoeConfig(ttft=0.5, tds=20.0)))
    assert summary["qoe_expected"] == {"ttft": 0.5, "tds": 20.0}
    assert summary["qoe"]["mean"] == pytest.approx(requests["qoe"].mean())
    assert requests["qoe"].between(0, 1).all()
    for t, a, q in zip(requests["token_times"], requests["arrival_time"], requests["qoe"]):
        assert q == pytest.approx(qoe_of(t, a, QoeConfig(0.5, 20.0)))
