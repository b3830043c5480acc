"""compare's statistics: replicates pooled with intervals inside each metric's limits, rankings
decided by pairwise tests (a tie at the top never hides a clearly worse configuration), and the
warnings that say a comparison is uninformative."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from policylab.analysis.compare import main as compare_main
from policylab.analysis.compare_figures import feasible_ylim, load_figure
from policylab.analysis.compare_findings import findings, light_load, slo_hint, warnings
from policylab.analysis.compare_stats import aggregate, best_marks, rankings
from policylab.analysis.intervals import difference, student_t, wilson_replicates
from policylab.analysis.run_table import METRICS
from tests.test_plots_compare import make_run_dir

pytestmark = pytest.mark.timeout(120)
TPOT, ATTAIN, GOODPUT = "TPOT p99 (ms)", "SLO attainment (%)", "goodput (req/s)"


def test_student_t_interval_and_its_cut_at_the_metrics_limits():
    low, high = student_t([1.0, 2.0, 3.0])
    assert high - 2.0 == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6) and low == pytest.approx(4 - high)
    assert math.isnan(student_t([5.0])[0]) and math.isnan(student_t([5.0, float("nan")])[1])
    low, high = student_t([0.1, 2.0, 15.0], (0.0, math.inf))          # goodput 5.7 ± 19: not below 0
    assert low == 0.0 and high == pytest.approx(5.7 + 4.302653 * np.std([0.1, 2, 15], ddof=1) / math.sqrt(3))


def test_wilson_interval_of_replicate_shares_stays_in_0_to_100():
    low, high = wilson_replicates([0.0, 100.0, 0.0], 100.0)          # the t interval: 33.3 ± 143.4
    assert 0.0 <= low < 33.4 < high <= 100.0
    # by hand: p = 1/3, var(p̂) = 1/9, n_eff = 2, z = t(0.975, 2)
    z2, n, p = 4.302653 ** 2, 2.0, 1 / 3
    centre, half = (p + z2 / (2 * n)) / (1 + z2 / n), 4.302653 / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    assert (low, high) == pytest.approx((100 * (centre - half), 100 * (centre + half)), rel=1e-6)
    assert wilson_replicates([100.0, 100.0, 100.0], 100.0) == (100.0, 100.0)
    for values in ([98.0, 99.5, 100.0], [0.0, 1.0, 0.5], [40.0, 60.0, 55.0, 45.0]):
        low, high = wilson_replicates(values, 100.0)
        assert 0.0 <= low <= np.mean(values) <= high <= 100.0


def test_paired_differences_where_replicates_match_a_bootstrap_otherwise():
    a = {"seed=0 replicate=1": 10.0, "seed=0 replicate=2": 20.0, "seed=0 replicate=3": 30.0}
    b = {k: v + 1.0 + 0.1 * i for i, (k, v) in enumerate(a.items())}   # always about 1 more
    d = difference(a, b, "a", "b")
    assert d.method == "paired" and d.n == 3 and d.separated and d.mean == pytest.approx(1.1)
    assert not difference(a, {"x": 11.0, "y": 21.0, "z": 31.0}, "a", "b").separated   # unpaired: spread swamps 1
    assert difference(a, {"x": 11.0, "y": 21.0, "z": 31.0}, "a", "b").method == "bootstrap"
    far = difference(a, {"x": 110.0, "y": 121.0, "z": 131.0}, "a", "b")
    assert far.method == "bootstrap" and far.separated and far.low > 0
    assert difference(a, {"x": 1.0}, "a", "b") is None


def runs(values: dict, metric=GOODPUT, trace="t", load=1.0) -> pd.DataFrame:
    """label → `metric` of each replicate (replicates share seeds); every other metric equal."""
    rows = [{"trace": trace, "load": load, "label": label, "rate": 10.0, "ttft_slo": 2.0, "partial": False,
             "replicate": f"seed=0 replicate={k + 1}", **{m: 1.0 for m in METRICS}, metric: v}
            for label, values_ in values.items() for k, v in enumerate(values_)]
    return pd.DataFrame(rows)


def test_a_tie_at_the_top_never_hides_a_clearly_worse_configuration():
    """Three configurations tied at about 17 ms and one at 580 ms: the worse one is ranked below
    the others and the finding says by how much (the former 'best separates from all others'
    rule called this comparison undecided)."""
    df = runs({"chunked": [17.3, 17.5, 17.6], "slo_aware": [17.5, 17.5, 17.55], "fairness": [17.3, 17.5, 17.6],
               "prefill_first": [400.0, 600.0, 740.0]}, metric=TPOT)
    agg = aggregate(df)
    ranked = [r for r in rankings(df, agg) if r.metric == TPOT]
    assert len(ranked) == 1 and ranked[0].tiers == (("chunked", "fairness", "slo_aware"), ("prefill_first",))
    step = ranked[0].steps[0]
    assert step.method == "paired" and step.worse == "prefill_first" and step.low > 0
    lines = findings(agg, rankings(df, agg))
    assert any(line.startswith("t at load ×1: TPOT p99 (ms) (lower is better): chunked ≈ fairness ≈ slo_aware, "
                               "ahead of prefill_first by 562.") and "paired over 3 replicates" in line
               for line in lines), lines
    assert not any("not separated on any metric" in n for n in warnings(df, agg, rankings(df, agg)))
    marks = {(agg.loc[i, "label"]): mark for (i, m), mark in best_marks(agg, ranked).items()}
    assert set(marks) == {"chunked", "fairness"} and marks["chunked"].ties == ("slo_aware",)


def test_higher_is_better_metrics_rank_downwards_into_three_tiers():
    df = runs({"a": [90.0, 92.0, 91.0], "b": [70.0, 71.0, 69.0], "c": [71.0, 70.5, 69.0], "d": [10.0, 12.0, 11.0]},
              metric=ATTAIN)
    agg = aggregate(df)
    r = next(r for r in rankings(df, agg) if r.metric == ATTAIN)
    assert r.tiers == (("a",), ("c", "b"), ("d",)) and [s.worse for s in r.steps] == ["c", "d"]
    assert r.steps[0].mean < 0                       # c − a: lower attainment
    assert ((agg[f"{ATTAIN} low"] >= 0) & (agg[f"{ATTAIN} high"] <= 100)).all()


def test_warnings_name_identical_replicates_no_separation_light_and_heavy_loads():
    df = runs({"a": [5, 5], "b": [5.1, 4.9]})
    df["KV peak (%)"], df["queueing p99 (s)"] = 7.0, 0.01
    agg = aggregate(df)
    notes = warnings(df, agg, rankings(df, agg))
    assert any("a on t at load ×1: its 2 replicates gave identical results" in n for n in notes)
    assert any("no two configurations are separated on any metric" in n for n in notes)
    assert any("light load: KV peaked at 7%" in n for n in notes)
    assert light_load(80.0, 0.01, 2.0) is None and light_load(7.0, 1.5, 2.0) is None
    full = runs({"a": [100.0] * 3, "b": [100.0] * 3}, metric=ATTAIN)
    assert any("load too light to rank on SLOs: every configuration met every SLO" in n and "trace.load=0.9" in n
               for n in warnings(full, aggregate(full), []))
    assert "try trace.load=0.7" in slo_hint([3.0, 10.0, 20.0]) and slo_hint([40.0, 80.0]) is None
    assert "trace.load=1" in slo_hint([100.0, 100.0], capacity_load=0.8)     # 1.25 × 0.8
    assert "trace.load=0.42" in slo_hint([10.0], capacity_load=0.6)


def test_load_figure_axes_stay_inside_each_metrics_limits():
    """Every configuration at 100 %: the attainment axis ends at 100, and no band dips below 0."""
    df = pd.concat([runs({"a": [100.0] * 3, "b": [100.0] * 3}, metric=ATTAIN, load=load) for load in (1.0, 2.0)])
    df[GOODPUT] = np.tile([0.1, 2.0, 15.0], 4)
    df["rate"] = df["load"] * 10
    agg = aggregate(df)
    assert (agg[f"{GOODPUT} low"] >= 0).all()
    axes = load_figure(agg).axes
    assert axes[0].get_ylim()[1] <= 100.0 and axes[1].get_ylim()[0] >= 0.0
    assert feasible_ylim((96.0, 104.0), (0.0, 100.0)) == (96.0, 100.0)
    assert feasible_ylim((-3.0, 20.0), (0.0, math.inf)) == (0.0, 20.0)


def test_compare_of_replicates_at_two_loads_writes_table_findings_figure_and_class_tables(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    job = 0
    for name, blocks in (("a", 400), ("b", 60)):
        for load, rate in ((1.0, 30.0), (2.0, 60.0)):
            for seed in (0, 1, 2):
                trace = {"name": "fixture", "rate_scale": load, "replicate": seed + 1}
                make_run_dir(sweep / f"{job}_{name}", n=30, rate=rate, seed=seed, num_blocks=blocks, name=name,
                             trace_cfg=trace, overrides=[f"policy={name}", f"trace.rate_scale={load}",
                                                     f"trace.replicate={seed + 1}", f"seed={seed}"])
                job += 1
    out = tmp_path / "cmp"
    assert compare_main([str(sweep), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    table = pd.read_csv(out / "compare.csv")
    assert list(zip(table["load"], table["label"], table["n"])) == [(1.0, "a", 3), (1.0, "b", 3),
                                                                    (2.0, "a", 3), (2.0, "b", 3)]
    for metric, (lo, hi) in ((ATTAIN, (0, 100)), (GOODPUT, (0, math.inf)), ("TTFT p99 (ms)", (0, math.inf))):
        assert ((table[f"{metric} low"] >= lo) & (table[f"{metric} high"] <= hi)).all()
        assert (table[f"{metric} low"] <= table[metric]).all() and (table[metric] <= table[f"{metric} high"]).all()
    curve = pd.read_csv(out / "metric_vs_load.csv")
    assert ((curve[f"{ATTAIN} low"] >= 0) & (curve[f"{ATTAIN} high"] <= 100)).all()
    for name in ("metric_vs_load", "cdf_compare"):
        assert (out / f"{name}.png").stat().st_size > 20_000 and len(pd.read_csv(out / f"{name}.csv")) > 0
    classes = pd.read_csv(out / "per_slo_class.csv")
    assert set(classes["group"]) == {"TTFT≤0.5s TPOT≤50ms"} and len(classes) == 4
    clients = pd.read_csv(out / "per_client.csv")
    assert set(clients["group"]) == {"c0", "c1", "c2"} and (clients["n"] == 3).all()
    markdown = (out / "compare.md").read_text()
    assert "## fixture at load ×1 (" in markdown and "## fixture at load ×2 (" in markdown
    assert "## Per SLO class" in markdown and "![metric_vs_load](metric_vs_load.png)" in markdown
    assert "Wilson" in markdown and "paired t" in markdown
    assert "findings, by pairwise tests at 95%" in printed and "(lower is better): a, ahead of b by" in printed
    assert "Findings:" in markdown and "ahead of b by" in markdown
