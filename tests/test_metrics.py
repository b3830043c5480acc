"""Metric definitions (DESIGN §6) on hand-built replays whose answers are computed by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest

from policylab.core.config import FairnessConfig, SloConfig
from policylab.core.result import STEP_FIELDS, RunResult
from policylab.analysis.client_fairness import Events, jain_index, service_difference
from policylab.analysis.metrics import flatten, request_table, step_table, summarize
from policylab.core.request import Request, Status, TraceRequest

SLO = SloConfig(ttft=1.0, tpot=0.5)


def make_request(i, t: TraceRequest, status, token_times=(), scheduled=None, finish=None,
                 preemptions=0, cached=0, reason="") -> Request:
    r = Request(i, t.arrival_time, np.zeros(t.prompt_tokens, np.int32), 100, t.client,
                t.priority, t.ttft_slo, t.tpot_slo)
    r.status, r.output_ids, r.token_times = status, [7] * len(token_times), list(token_times)
    r.first_scheduled_time, r.finish_time, r.reject_reason = scheduled, finish, reason
    r.num_preemptions, r.num_cached_tokens_total = preemptions, cached
    return r


def make_steps(rows) -> dict:
    """rows: (clock, duration, kv_used_blocks); the other step columns are 0."""
    steps = {k: [0] * len(rows) for k in STEP_FIELDS}
    steps["clock"] = [r[0] for r in rows]
    steps["duration"] = [r[1] for r in rows]
    steps["kv_used_blocks"] = [r[2] for r in rows]
    return steps


def four_request_run(status="complete", error="") -> RunResult:
    """A: arrives 0, 3 tokens at .5/.7/1.0.  B: arrives 1, scheduled 1.5, 1 token at 2.0.
    A: arrives 2 and is rejected.  B: arrives 3, own TPOT SLO 0.1, tokens at 3.25/4.0."""
    trace = [TraceRequest(0.0, 4, 3, client="A"), TraceRequest(1.0, 2, 1, client="B"),
             TraceRequest(2.0, 10, 2, client="A"), TraceRequest(3.0, 3, 2, client="B", tpot_slo=0.1)]
    requests = [
        make_request(0, trace[0], Status.FINISHED, (0.5, 0.7, 1.0), 0.0, 1.0, cached=2),
        make_request(1, trace[1], Status.FINISHED, (2.0,), 1.5, 2.0),
        make_request(2, trace[2], Status.REJECTED, finish=2.0, reason="too long"),
        make_request(3, trace[3], Status.FINISHED, (3.25, 4.0), 3.0, 4.0, preemptions=1),
    ]
    steps = make_steps([(0.0, 0.5, 2), (0.5, 0.2, 2), (0.7, 0.3, 2), (1.5, 0.5, 1),
                        (3.0, 0.25, 4), (3.25, 0.75, 4)])
    return RunResult(trace, requests, steps, num_blocks=8, block_size=4, policy="hand",
                     status=status, error=error)


def summary_of(result: RunResult) -> dict:
    return summarize(request_table(result, SLO), step_table(result), result, SLO, FairnessConfig())


def test_request_table_per_request_metrics():
    df = request_table(four_request_run(), SLO)
    assert list(df["req_id"]) == [0, 1, 2, 3]
    assert list(df["status"]) == ["finished", "finished", "rejected", "finished"]
    assert np.allclose(df["ttft"], [0.5, 1.0, np.nan, 0.25], equal_nan=True)
    assert np.allclose(df["e2e"], [1.0, 1.0, np.nan, 1.0], equal_nan=True)
    # TPOT = (E2E - TTFT) / (n - 1); undefined for the 1-token request
    assert np.allclose(df["tpot"], [0.25, np.nan, np.nan, 0.75], equal_nan=True)
    assert np.allclose(df["normalized_latency"], [1 / 3, 1.0, np.nan, 0.5], equal_nan=True)
    assert np.allclose(df["queueing_delay"], [0.0, 0.5, np.nan, 0.0], equal_nan=True)
    assert list(df["generated_tokens"]) == [3, 1, 0, 2]
    assert list(df["preemptions"]) == [0, 0, 0, 1]
    assert list(df["tpot_slo"]) == [0.5, 0.5, 0.5, 0.1]      # the trace's own SLO wins
    assert list(df["token_times"][0]) == [0.5, 0.7, 1.0]


def test_slo_met_rules():
    df = request_table(four_request_run(), SLO)
    # 0: both met; 1: TTFT exactly at target, one token → TPOT met; 2: rejected; 3: TPOT 0.75 > 0.1
    assert list(df["slo_met"]) == [True, True, False, False]


def test_rejected_row_keeps_reason_and_no_latency():
    row = request_table(four_request_run(), SLO).iloc[2]
    assert row["status"] == "rejected" and row["reason"] == "too long"
    assert math.isnan(row["ttft"]) and math.isnan(row["e2e"]) and not row["slo_met"]


def test_summary_aggregates_by_hand():
    s = summary_of(four_request_run())
    assert s["counts"] == {"requests": 4, "finished": 3, "rejected": 1, "unfinished": 0}
    assert s["trace_duration"] == pytest.approx(3.0)          # arrivals 0 … 3
    assert s["makespan"] == pytest.approx(4.0)                # first arrival 0 → last token 4.0
    assert s["ttft"]["mean"] == pytest.approx((0.5 + 1.0 + 0.25) / 3)
    assert s["ttft"]["p50"] == pytest.approx(0.5)
    assert s["ttft"]["p90"] == pytest.approx(0.5 + 0.8 * 0.5)  # linear between 0.5 and 1.0
    assert s["tpot"]["mean"] == pytest.approx((0.25 + 0.75) / 2)   # 1-token request excluded
    assert s["tpot"]["max"] == pytest.approx(0.75)
    # ITL pooled: gaps .2 and .3 (request 0) and .75 (request 3)
    assert s["itl"]["mean"] == pytest.approx((0.2 + 0.3 + 0.75) / 3)
    assert s["itl"]["p50"] == pytest.approx(0.3)
    assert s["itl"]["max"] == pytest.approx(0.75)
    assert s["slo_attainment"] == pytest.approx(2 / 4)        # rejected counts as a miss
    assert s["goodput"] == pytest.approx(2 / 4.0)             # 2 met / 4 s of makespan (as throughput)
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(6 / 4.0)
    assert s["throughput"]["input_tokens_per_s"] == pytest.approx((4 + 2 + 3) / 4.0)
    assert s["throughput"]["requests_per_s"] == pytest.approx(3 / 4.0)
    assert s["goodput"] <= s["throughput"]["requests_per_s"]
    assert s["preemptions"] == 1
    assert s["prefix_cache_hit_rate"] == pytest.approx(2 / 9)
    assert s["kv_utilization"]["max"] == pytest.approx(4 / 8)
    assert s["kv_utilization"]["mean"] == pytest.approx((2 + 2 + 2 + 1 + 4 + 4) / 6 / 8)
    assert s["rejections"] == [{"req_id": 2, "client": "A", "reason": "too long"}]
    assert s["status"] == "complete" and s["partial"] is False


def test_summary_fairness_on_hand_example():
    fair = summary_of(four_request_run())["fairness"]
    # service (w_in=1, w_out=2): A = 4 + 3·2 = 10, B = (2 + 2) + (3 + 2·2) = 11
    # demand: A = (4 + 3·2) + (10 + 2·2) = 24, B = (2 + 2) + (3 + 2·2) = 11
    x = np.array([10 / 24, 11 / 11])
    assert fair["num_clients"] == 2
    assert fair["jain_index"] == pytest.approx(x.sum() ** 2 / (2 * (x ** 2).sum()))
    # A is backlogged on [0, 1), B on [1, 2) and [3, 4): never two at once
    assert fair["service_difference_max"] == 0.0


def test_partial_run_marks_unarrived_requests():
    result = four_request_run(status="partial", error="ContractViolation: boom")
    result.requests[3] = None
    result.requests[1].status, result.requests[1].finish_time = Status.RUNNING, None
    df = request_table(result, SLO)
    assert list(df["status"]) == ["finished", "unfinished", "rejected", "unfinished"]
    assert df["reason"][3] == "never arrived (run stopped)"
    assert df["reason"][1] == "running when the run stopped"
    s = summary_of(result)
    assert s["status"] == "partial" and s["partial"] is True
    assert s["error"] == "ContractViolation: boom"
    assert s["counts"]["unfinished"] == 2 and s["slo_attainment"] == pytest.approx(1 / 4)


def test_empty_distributions_are_none_and_flatten():
    result = four_request_run()
    result.requests = [None] * 4
    result.steps = make_steps([])
    s = summary_of(result)
    assert s["ttft"]["p99"] is None and s["itl"]["mean"] is None and s["makespan"] is None
    assert s["goodput"] is None and s["throughput"]["output_tokens_per_s"] is None   # no makespan: no rate
    flat = flatten(s)
    assert flat["ttft/p99.9"] is None and flat["counts/requests"] == 4
    assert "rejections" not in flat and not any(isinstance(v, (dict, list)) for v in flat.values())


@pytest.mark.parametrize("x, expected", [([3, 3, 3, 3], 1.0), ([5, 0, 0, 0], 0.25),
                                         ([1, 2], 9 / 10)])
def test_jain_index_known_values(x, expected):
    assert jain_index(x) == pytest.approx(expected)


def test_jain_index_undefined_without_service():
    assert math.isnan(jain_index([])) and math.isnan(jain_index([0, 0]))


def test_service_difference_two_clients():
    # both backlogged on [0, 10); client 2 has the most service but is never backlogged
    service = Events(np.array([1.0, 2.0, 3.0, 4.0, 5.0]), np.array([0, 1, 0, 1, 2]),
                     np.array([5.0, 2.0, 1.0, 4.0, 100.0]))
    backlog = Events(np.array([0.0, 0.0, 10.0, 10.0]), np.array([0, 1, 0, 1]),
                     np.array([1.0, 1.0, -1.0, -1.0]))
    worst, mean = service_difference(service, backlog, 3)
    # diff over time: [0,1) 0, [1,2) 5, [2,3) 3, [3,4) 4, [4,10) 0
    assert worst == pytest.approx(5.0)
    assert mean == pytest.approx((0 + 5 + 3 + 4 + 0 * 6) / 10)


def naive_service_difference(service: Events, backlog: Events, num_clients: int):
    """Reference: recompute every client's totals from scratch at every event time."""
    times = np.unique(np.concatenate([service.time, backlog.time]))
    diffs = []
    for t in times:
        served = [service.value[(service.client == c) & (service.time <= t)].sum()
                  for c in range(num_clients)]
        waiting = [backlog.value[(backlog.client == c) & (backlog.time <= t)].sum()
                   for c in range(num_clients)]
        active = [x for x, w in zip(served, waiting) if w > 0]
        diffs.append(max(active) - min(active) if len(active) >= 2 else np.nan)
    diffs = np.array(diffs)
    weights = np.diff(times, append=times[-1])
    defined = ~np.isnan(diffs)
    return diffs[defined].max(), np.dot(diffs[defined], weights[defined]) / weights[defined].sum()


@pytest.mark.parametrize("max_cells", [1 << 22, 7, 60])   # one block; one row per block; mixed
def test_service_difference_matches_reference(monkeypatch, max_cells):
    import policylab.analysis.client_fairness as fairness
    rng = np.random.default_rng(0)
    n, clients, requests = 300, 6, 40
    service = Events(rng.uniform(0, 100, n), rng.integers(0, clients, n),
                     rng.integers(1, 9, n).astype(float))
    arrive = rng.uniform(0, 60, requests)
    backlog = Events(np.concatenate([arrive, arrive + rng.uniform(1, 40, requests)]),
                     np.tile(rng.integers(0, clients, requests), 2),
                     np.repeat([1.0, -1.0], requests))
    monkeypatch.setattr(fairness, "MAX_CELLS", max_cells)
    assert service_difference(service, backlog, clients) == pytest.approx(
        naive_service_difference(service, backlog, clients))


def test_itl_leaves_out_the_gaps_of_unfinished_requests():
    """ITL pools the token gaps of finished requests only (DESIGN §6): request 3 of the hand run,
    left running when the run stopped (gap .75), drops out; request 0's gaps .2 and .3 remain."""
    result = four_request_run(status="partial", error="stopped")
    result.requests[3].status, result.requests[3].finish_time = Status.RUNNING, None
    s = summary_of(result)
    assert s["itl"]["mean"] == pytest.approx((0.2 + 0.3) / 2)
    assert s["itl"]["max"] == pytest.approx(0.3)


@pytest.mark.parametrize("rate, blocks, ttft_slo", [(5.0, 400, 2.0), (60.0, 96, 0.5), (400.0, 40, 0.05)],
                         ids=["light", "preempting", "overloaded"])
def test_goodput_never_exceeds_request_throughput(tmp_path, rate, blocks, ttft_slo):
    """One denominator (the makespan) for goodput and every throughput: goodput ≤ requests/s on
    real replays, light or overloaded, with arrivals that end long before the last completion."""
    import json
    from tests.test_plots_compare import make_run_dir
    s = json.loads((make_run_dir(tmp_path / "run", n=60, rate=rate, num_blocks=blocks, ttft_slo=ttft_slo)
                    / "summary.json").read_text())
    assert s["makespan"] >= s["trace_duration"] > 0
    met = round(s["slo_attainment"] * s["counts"]["requests"])
    assert s["goodput"] == pytest.approx(met / s["makespan"])
    assert s["goodput"] <= s["throughput"]["requests_per_s"] + 1e-12
