"""`trace.load`: the arrival rate as a fraction of the configuration's estimated capacity, resolved
to a rate scale before the run, cached, reported in the summary and used by `compare`."""
from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir

from policylab.analysis.compare_stats import aggregate
from policylab.analysis.report import title_of
from policylab.analysis.run_table import collect_runs, find_run_dirs
from policylab.apps import offered_load
from policylab.apps.config import CONFIG_DIR, register, typed_config
from policylab.apps.jobs import RunError
from policylab.apps.offered_load import capacity_estimate, resolve_load
from policylab.apps.run import run

pytestmark = pytest.mark.timeout(300)
QUIET = ["logger=none", "progress=false", "plots=false", "dataplane=sim", "trace=poisson"]
register()


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POLICYLAB_CACHE", str(tmp_path / "cache"))


def config(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=[*QUIET, *overrides])


def test_the_load_is_a_share_of_the_capacity_the_engine_then_serves(tmp_path):
    """At half the estimated capacity the engine keeps up with the arrivals; at twice it, it
    completes requests at about the estimated capacity (the queue grows): the estimate is the
    engine's throughput, in the unit the arrivals are given in."""
    half = run(config("policy=chunked", "trace.load=0.5", "trace.repeat=4"), tmp_path / "half")
    load = half["load"]
    assert load["fraction"] == 0.5 and load["rate_scale"] == pytest.approx(0.5 * load["capacity_rate"]
                                                                           / load["trace_rate"])
    assert half["config"]["trace"]["rate_scale"] == pytest.approx(load["rate_scale"])
    arrivals = half["counts"]["requests"] / half["trace_duration"]
    assert arrivals == pytest.approx(0.5 * load["capacity_rate"], rel=0.05)
    assert half["throughput"]["requests_per_s"] == pytest.approx(arrivals, rel=0.1)       # it keeps up
    double = run(config("policy=chunked", "trace.load=2", "trace.repeat=4"), tmp_path / "double")
    assert double["load"]["capacity_rate"] == load["capacity_rate"]      # policy-independent: same estimate
    served = double["throughput"]["requests_per_s"]
    assert 0.7 * load["capacity_rate"] < served < 1.15 * load["capacity_rate"]          # saturated
    assert served < 0.6 * double["counts"]["requests"] / double["trace_duration"]


def test_the_estimate_is_cached_per_configuration(monkeypatch, tmp_path):
    cfg = typed_config(config("trace.load=0.8"))
    first = capacity_estimate(cfg)
    assert first["cached"] == "" and first["capacity_rate"] > 0
    monkeypatch.setattr(offered_load, "saturation_throughput", lambda cfg: pytest.fail("not read from the cache"))
    again = capacity_estimate(typed_config(config("trace.load=0.5", "policy=fairness", "trace.replicate=2")))
    assert again["cached"] and again["capacity_rate"] == first["capacity_rate"]
    monkeypatch.undo()
    monkeypatch.setenv("POLICYLAB_CACHE", str(tmp_path / "cache"))
    other = capacity_estimate(typed_config(config("trace.load=0.8", "hardware=a100")))
    assert other["cached"] == "" and other["capacity_rate"] < first["capacity_rate"]   # an A100 serves less


@pytest.mark.parametrize("overrides, message", [
    (["trace.load=-1"], "trace.load=-1: expected a fraction of the estimated capacity > 0"),
    (["trace=chat_sessions", "trace.sessions=true", "trace.load=0.5"], "closed-loop sessions"),
], ids=["negative", "sessions"])
def test_a_load_that_cannot_work_is_refused_in_one_line(overrides, message):
    with pytest.raises(RunError, match=message):
        resolve_load(typed_config(config(*overrides)))


def test_compare_groups_runs_by_their_share_of_capacity(tmp_path):
    import dataclasses
    sweep = tmp_path / "sweep"
    composed = {p: typed_config(config(f"policy={p}", "trace.max_requests=150")) for p in ("prefill_first", "chunked")}
    for k, (policy, load, replicate) in enumerate([(p, f, r) for p in composed for f in (0.5, 0.9) for r in (1, 2)]):
        overrides = [f"policy={policy}", "trace.max_requests=150", f"trace.load={load}", f"trace.replicate={replicate}"]
        cfg = composed[policy]
        run_dir = sweep / f"{k}_{policy}"
        run(dataclasses.replace(cfg, trace=dataclasses.replace(cfg.trace, load=load, replicate=replicate)), run_dir)
        (run_dir / ".hydra").mkdir()
        (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in [*QUIET, *overrides]))
    df, common = collect_runs(find_run_dirs([sweep]))
    assert "trace.max_requests=150" in common and set(df["trace"]) == {"poisson"}     # the load is no trace
    agg = aggregate(df)
    assert list(zip(agg["capacity_load"], agg["label"], agg["n"])) == [
        (0.5, "prefill_first", 2), (0.5, "chunked", 2), (0.9, "prefill_first", 2), (0.9, "chunked", 2)]
    titles = [title_of(group) for _, group in agg.groupby(["trace", "load"], sort=False)]
    assert [t.split(" (×")[0] for t in titles] == ["poisson at load 0.5 of capacity", "poisson at load 0.9 of capacity"]
    assert json.loads((sweep / "0_prefill_first" / "summary.json").read_text())["load"]["fraction"] == 0.5
