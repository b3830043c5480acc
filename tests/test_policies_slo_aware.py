"""slo_aware: least slack first, decodes on their TPOT pace, TTFT admission control."""
import dataclasses

import numpy as np
import pytest

from policies.chunked import Chunked
from policies.slo_aware import SloAware
from policylab.core.config import EngineConfig, HardwareConfig, SloConfig
from policylab.analysis.metrics import request_table
from policylab.core.request import TraceRequest as T
from policylab.testing import load_policy
from policylab.testing.replay import replay

CFG = EngineConfig(block_size=16, num_blocks=400, max_num_batched_tokens=2048, max_num_seqs=16)


def test_least_slack_is_admitted_first():
    trace = [T(0.0, 400, 2, ttft_slo=10.0), T(0.0, 400, 2, ttft_slo=10.0), T(0.0, 400, 2, ttft_slo=0.05)]
    result, _ = replay(SloAware(chunk_size=512), trace, CFG)
    first = [r.token_times[0] for r in result.requests]
    assert first[2] < first[0] < first[1]     # the tight one jumps the queue; FCFS among equals


@pytest.mark.parametrize("late_policy", ["serve", "reject"])
def test_requests_that_cannot_meet_ttft_are_served_last_or_rejected_with_a_reason(late_policy):
    trace = [T(0.0, 300, 4, ttft_slo=1e-4)] + [T(0.0, 300, 4, ttft_slo=5.0) for _ in range(3)]
    result, records = replay(SloAware(chunk_size=512, late_policy=late_policy), trace, CFG)
    late, others = result.requests[0], result.requests[1:]
    assert all(r.status.value == "finished" for r in others)
    if late_policy == "reject":
        assert late.status.value == "rejected" and "cannot meet its TTFT SLO" in late.reject_reason
        assert any(0 in r.plan.reject for r in records)
    else:
        assert late.status.value == "finished"
        assert late.first_scheduled_time >= max(r.first_scheduled_time for r in others)


# the H100 this scenario was timed on: a Llama-3-8B decode step alone takes ~10 ms
SCENARIO_H100 = HardwareConfig(flops_efficiency=0.6, bw_efficiency=0.8, step_overhead=0.004)


def decode_tpot_and_chunks(policy) -> tuple:
    """A decode with a 13 ms TPOT target (a step alone takes ~10 ms) meets a 6k-token prompt."""
    trace = [T(0.0, 50, 30, tpot_slo=0.013), T(0.03, 6000, 2, ttft_slo=60.0)]
    result, records = replay(policy, trace, EngineConfig(max_num_batched_tokens=4096), model="llama3-8b",
                             hardware=SCENARIO_H100, cost_model="roofline")   # step cost linear in tokens,
                                                                              # as the policy's estimate
    times = result.requests[0].token_times
    chunks = [r.plan.num_scheduled_tokens[1] for r in records
              if 1 in r.plan.num_scheduled_tokens and 0 in r.running]
    return (times[-1] - times[0]) / (len(times) - 1), chunks


def test_prefill_chunks_shrink_to_keep_a_decode_on_its_tpot_pace():
    tpot, chunks = decode_tpot_and_chunks(SloAware(chunk_size=2048))
    blind_tpot, blind_chunks = decode_tpot_and_chunks(Chunked(chunk_size=2048))
    assert blind_tpot > 0.013 and max(blind_chunks) == 2047       # full chunks break the target
    assert tpot <= 0.013 and max(chunks) < 1024                   # measured: 0.0128 s, chunks ~400


def test_learned_costs_track_the_observed_step_durations():
    trace = [T(0.01 * i, 200 + 40 * i, 60) for i in range(20)]
    policy = SloAware(decode_step_cost=0.5, prefill_token_cost=1e-3)     # both far off
    result, _ = replay(policy, trace, EngineConfig(max_num_batched_tokens=1024), model="llama3-8b")
    steps = result.steps
    decode_only = np.median([d for d, p in zip(steps["duration"], steps["prefill_tokens"]) if p == 0])
    assert 0.5 * decode_only < policy.decode_step_cost < 2 * decode_only
    assert policy.prefill_token_cost < 1e-4


def test_decisions_never_depend_on_the_true_output_length():
    base = [T(0.002 * i, 100 + 30 * i, 40) for i in range(12)]
    longer = [dataclasses.replace(t, output_tokens=400) if i == 3 else t for i, t in enumerate(base)]
    _, a = replay(SloAware(), base, CFG)
    _, b = replay(SloAware(), longer, CFG)
    live = [3 in r.running or 3 in r.waiting for r in a]
    gone = live.index(False, live.index(True))          # first decision after request 3 finished
    assert [r.plan for r in a[:gone]] == [r.plan for r in b[:gone]] and gone > 10


def mixed_slo_trace(seed: int = 0, duration: float = 15.0) -> list:
    """Chat (tight SLOs, short prompts, 12 req/s) mixed with batch jobs (3-6k-token prompts, 3 req/s)."""
    rng = np.random.default_rng(seed)
    classes = (("chat", 12.0, (100, 500), (40, 120), 0.15, 0.02),
               ("batch", 3.0, (2000, 6000), (50, 150), 5.0, 0.1))
    out = []
    for client, rate, prompt, output, ttft, tpot in classes:
        times = np.cumsum(rng.exponential(1 / rate, int(rate * duration * 2)))
        out += [T(round(float(t), 6), int(rng.integers(*prompt)), int(rng.integers(*output)), client=client,
                  ttft_slo=ttft, tpot_slo=tpot) for t in times[times < duration]]
    return sorted(out, key=lambda t: t.arrival_time)


def test_higher_slo_attainment_than_prefill_first_at_moderate_load():
    trace, cfg = mixed_slo_trace(), EngineConfig(max_num_batched_tokens=4096, max_num_seqs=64)
    attainment = {}
    for name in ("slo_aware", "chunked", "prefill_first"):
        result, _ = replay(name, trace, cfg, model="llama3-8b")
        attainment[name] = request_table(result, SloConfig())["slo_met"].mean()
    # measured: slo_aware 0.94, chunked 0.82, prefill_first 0.64
    assert attainment["slo_aware"] > attainment["prefill_first"] + 0.1
    assert attainment["slo_aware"] > attainment["chunked"]


def test_yaml_defaults_follow_the_run_slo_config():
    policy = load_policy("slo_aware")
    assert (policy.ttft_slo, policy.tpot_slo) == (SloConfig().ttft, SloConfig().tpot)


@pytest.mark.parametrize("kwargs", [{"late_policy": "drop"}, {"ttft_slo": 0}, {"prefill_token_cost": -1.0}])
def test_rejects_bad_parameters(kwargs):
    with pytest.raises(ValueError):
        SloAware(**kwargs)
