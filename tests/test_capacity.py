"""Capacity search: bisection on a known curve, then a real search on the simulated data plane."""
from __future__ import annotations

import json
import math
import sys

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hypothesis import given, strategies as st

import policylab.apps.capacity as capacity
from policylab.apps.cli import main
from policylab.apps.capacity import find_capacity, job_args, search
from policylab.apps.config import CONFIG_DIR, CapacityConfig


def step_curve(threshold: float, calls: list):
    """SLO attainment 1 up to `threshold` (rate_scale), 0.5 above it."""
    def evaluate(scale):
        calls.append(scale)
        return {"slo_attainment": 1.0 if scale <= threshold else 0.5}
    return evaluate


@given(st.floats(min_value=-3.0, max_value=3.0))
def test_bisection_brackets_the_threshold_to_its_precision(log10_threshold):
    threshold, calls, cap = 10 ** log10_threshold, [], CapacityConfig(lo=0.5, hi=8.0, iters=7, widen=3)
    status, scale, rows = search(step_curve(threshold, calls), cap)
    assert status == "found" and len(rows) == len(set(calls)) == len(calls)   # each scale replayed once
    precision = 16 ** (1 / 2 ** cap.iters)
    assert scale <= threshold < scale * precision * (1 + 1e-9)


def test_capacity_outside_the_widened_bracket_is_reported():
    cap = CapacityConfig(lo=0.5, hi=8.0, iters=5, widen=2)        # can reach [0.5/256, 8*256]
    status, scale, _ = search(step_curve(1e6, []), cap)
    assert (status, scale) == ("above_range", 8.0 * 16 * 16)
    status, scale, rows = search(step_curve(1e-6, []), cap)
    assert (status, scale) == ("below_range", None) and min(r["slo_attainment"] for r in rows) == 0.5


def test_bad_bracket_is_a_clear_error():
    with pytest.raises(ValueError, match="need 0 < lo < hi"):
        search(step_curve(1.0, []), CapacityConfig(lo=4.0, hi=2.0))


def sim_config(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=["policy=prefill_first", "trace=poisson", "dataplane=sim",
                                            "logger=none", "trace.max_requests=60", "slo.ttft=0.2",
                                            "slo.tpot=0.05", *overrides])


def test_find_capacity_on_the_sim_data_plane(tmp_path):
    cfg = sim_config()
    result = find_capacity(cfg, CapacityConfig(target=0.9, lo=8.0, hi=512.0, iters=3, sustain=False), tmp_path)
    curve = pd.read_csv(tmp_path / "capacity.csv")
    assert result.status == "found" and len(curve) >= 5
    assert (tmp_path / "capacity.png").stat().st_size > 20_000
    assert list(curve["rate_scale"]) == sorted(curve["rate_scale"])
    # rate is proportional to rate_scale: the same trace, compressed
    per_scale = curve["rate"] / curve["rate_scale"]
    assert per_scale.std() / per_scale.mean() < 1e-9
    met = curve["slo_attainment"] >= 0.9
    assert met.iloc[0] and not met.iloc[-1]
    at = curve.index[curve["rate_scale"] == result.rate_scale][0]
    assert met[at] and not met[at + 1]                   # the next scale tried above it misses
    saved = json.loads((tmp_path / "capacity.json").read_text())
    assert saved["rate"] == pytest.approx(curve["rate"][at]) and saved["policy"] == "prefill_first"
    assert cfg.trace.rate_scale == 1.0                   # the caller's config is left alone


def test_shorthands_and_run_dir_of_the_cli():
    args = job_args(["-m", "policy=a,b", "target=0.8", "iters=4", "slo.ttft=1"])
    assert args[-1].startswith("hydra.run.dir=outputs/")
    assert args[:-1] == ["-m", "policy=a,b", "capacity.target=0.8", "capacity.iters=4", "slo.ttft=1"]
    assert job_args(["hydra.run.dir=x", "lo=2"]) == ["hydra.run.dir=x", "capacity.lo=2"]


def test_capacity_job_end_to_end(tmp_path, monkeypatch, capsys):
    overrides = ["policy=prefill_first", "trace=poisson", "dataplane=sim", "trace.max_requests=40",
                 "hardware.step_overhead=0.004", "serving_engine=none",   # the step cost this bracket was chosen for
                 "slo.ttft=0.2", "target=0.8", "lo=1", "hi=64", "iters=2", f"hydra.run.dir={tmp_path}", "logger=none",
                 "capacity.sustain=false"]      # replays as short as the trace: warned about
    monkeypatch.setattr(sys, "argv", ["policylab"])
    main(["capacity", *overrides])
    captured = capsys.readouterr()
    out = captured.out
    saved = json.loads((tmp_path / "capacity.json").read_text())
    low, high = saved["interval"]
    assert low == saved["rate"] < high and f"bisection interval: [{low:.3f}, {high:.3f}] req/s" in out
    assert "measures a transient; lengthen the trace with trace.repeat=" in captured.err   # 40 requests: seconds
    assert saved["search"]["target"] == 0.8 and saved["search"]["iters"] == 2
    assert f"{saved['rate']:.3f} req/s" in out and math.isfinite(saved["rate"])


def fake_curve(threshold: float):
    """A replay stand-in: attainment falls from 1 to 0.5 above `threshold` (rate_scale); 10 req/s per scale."""
    def evaluate(scale, min_span=0.0):
        ok = scale <= threshold
        return {"rate_scale": scale, "rate": 10.0 * scale, "slo_attainment": 1.0 if ok else 0.5,
                "goodput": 10.0 * scale, "ttft_p50": 0.1, "ttft_p99": 0.2 if ok else 3.0, "tpot_p50": 0.01,
                "tpot_p99": 0.02, "preemptions": 0, "rejected": 0, "replay_s": 60.0 / scale,
                "status": "complete", "error": ""}
    return evaluate


@pytest.mark.slow
def test_compare_overlays_the_capacity_curves_of_several_searches(tmp_path, capsys):
    from policylab.analysis.compare import main as compare_main
    for name, threshold in (("prefill_first", 1.5), ("chunked", 3.0)):
        cfg = sim_config(f"policy={name}")
        result = find_capacity(cfg, CapacityConfig(lo=0.5, hi=8.0, iters=4), tmp_path / name, fake_curve(threshold))
        low, high = result.interval
        assert low <= 10 * threshold < high and high / low < 16 ** (1 / 16) * 1.0001
    assert compare_main([str(tmp_path), "-o", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert "capacity of chunked" in out and "bisection interval [" in out
    curves = pd.read_csv(tmp_path / "cmp" / "capacity_compare.csv")
    assert set(curves["policy"]) == {"prefill_first", "chunked"} and set(curves["search_status"]) == {"found"}
    assert set(curves["status"]) == {"complete"}                   # each replay's own status is kept
    assert (tmp_path / "cmp" / "capacity_compare.png").stat().st_size > 20_000


def transient_curve(calls: list):
    """Capacity 3 (rate_scale) on replays under 60 s of arrivals, 2 once the queue has built up."""
    def evaluate(scale, min_span=0.0):
        calls.append((scale, min_span))
        ok = scale <= (3.0 if min_span < 60 else 2.0)
        return {"rate_scale": scale, "rate": 10.0 * scale, "slo_attainment": 1.0 if ok else 0.5,
                "goodput": 10.0 * scale, "ttft_p50": 0.1, "ttft_p99": 0.2, "tpot_p50": 0.01, "tpot_p99": 0.02,
                "preemptions": 0, "rejected": 0, "replay_s": min_span, "status": "complete", "error": ""}
    return evaluate


def test_the_search_repeats_until_the_capacity_holds_over_twice_its_span(tmp_path):
    calls = []
    cap = CapacityConfig(target=0.9, lo=0.5, hi=8.0, iters=6, min_replay_s=30.0)
    result = find_capacity(sim_config(), cap, tmp_path, evaluate=transient_curve(calls))
    assert 2.0 * 16 ** (-1 / 64) <= result.rate_scale <= 2.0                  # the sustained capacity
    assert result.steady_span_s == 60.0                                       # 30 s misled, 60 s held at 120 s
    assert {span for _, span in calls} == {30.0, 60.0, 120.0}
    saved = json.loads((tmp_path / "capacity.json").read_text())
    assert saved["steady_span_s"] == 60.0 and saved["interval"][0] == pytest.approx(10.0 * result.rate_scale)
    unsustained = find_capacity(sim_config(), CapacityConfig(target=0.9, lo=0.5, hi=8.0, iters=6, sustain=False),
                                tmp_path / "short", evaluate=transient_curve([]))
    assert unsustained.rate_scale > 2.9 and unsustained.steady_span_s is None   # the transient's answer


@pytest.mark.slow
def test_sustained_replays_on_the_sim_span_the_minimum(tmp_path):
    cfg = sim_config()
    result = find_capacity(cfg, CapacityConfig(target=0.9, lo=8.0, hi=128.0, iters=2, min_replay_s=5.0), tmp_path)
    curve = pd.read_csv(tmp_path / "capacity.csv")
    spans = (curve["rate_scale"] * 0 + 1) * 60 / curve["rate"] * curve["repeat"]  # 60 requests per tile
    assert (spans >= 5.0 * 0.9).all() and (curve["repeat"] > 1).all()
    assert result.status == "found" and result.steady_span_s is not None
