"""sjf: shortest predicted job first, with aging; never the true output length."""
import dataclasses

import pytest

from policies.sjf import ShortestJobFirst
from policylab.core.config import EngineConfig
from policylab.core.request import TraceRequest as T
from policylab.testing.replay import replay

ONE_AT_A_TIME = EngineConfig(block_size=16, num_blocks=400, max_num_batched_tokens=512, max_num_seqs=1)


def order(result) -> list:
    return [rid for _, rid in sorted((r.first_scheduled_time, r.req_id) for r in result.requests)]


def test_shortest_predicted_output_first_with_the_oracle_predictor():
    trace = [T(0.0, 40, n) for n in (30, 5, 60, 10)]
    cfg = dataclasses.replace(ONE_AT_A_TIME, predictor="oracle")
    result, _ = replay(ShortestJobFirst(aging_rate=0.0), trace, cfg)
    assert order(result) == [1, 3, 0, 2]


def test_without_a_predictor_size_is_prompt_plus_capped_max_tokens():
    trace = [T(0.0, 300, 5), T(0.0, 40, 5, max_tokens=400), T(0.0, 40, 5, max_tokens=8), T(0.0, 100, 5)]
    result, _ = replay(ShortestJobFirst(aging_rate=0.0, default_output_tokens=64), trace, ONE_AT_A_TIME)
    # sizes: 300+64, 40+64 (400 capped at 64), 40+8, 100+64
    assert order(result) == [2, 1, 3, 0]


def test_decisions_never_depend_on_the_true_output_length():
    base = [T(0.0, 40 + 10 * i, 6) for i in range(8)]
    longer = [dataclasses.replace(t, output_tokens=300) if i == 5 else t for i, t in enumerate(base)]
    a, _ = replay(ShortestJobFirst(), base, ONE_AT_A_TIME)
    b, _ = replay(ShortestJobFirst(), longer, ONE_AT_A_TIME)
    assert order(a) == order(b)


def test_aging_serves_a_long_job_within_its_bound_despite_short_ones():
    long_job = T(0.0, 400, 4)
    shorts = [T(0.01 * i, 20, 4) for i in range(80)]
    starved, _ = replay(ShortestJobFirst(aging_rate=0.0), [long_job] + shorts, ONE_AT_A_TIME)
    assert order(starved)[-1] == 0
    rate = 2000.0                                  # (464 - 84) tokens of size / 2000 per s = 0.19 s
    result, _ = replay(ShortestJobFirst(aging_rate=rate), [long_job] + shorts, ONE_AT_A_TIME)
    started = result.requests[0].first_scheduled_time
    passed_it = [r for r in result.requests[1:] if r.first_scheduled_time < started]
    assert passed_it and all(r.arrival_time <= (464 - 84) / rate + 1e-9 for r in passed_it)


def test_rejects_bad_default_output():
    with pytest.raises(ValueError, match="default_output_tokens"):
        ShortestJobFirst(default_output_tokens=0)
