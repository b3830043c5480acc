"""compare's statistics: replicates pooled with Student-t intervals, "best" only among
comparable runs, and the warnings that say a comparison is uninformative."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from policylab.analysis.compare import main as compare_main
from policylab.analysis.compare_stats import aggregate, best_marks, ci_half_width, findings, light_load
from policylab.analysis.run_table import METRICS
from tests.test_plots_compare import make_run_dir


def test_ci_half_width_is_the_student_t_interval():
    assert ci_half_width([1.0, 2.0, 3.0]) == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert math.isnan(ci_half_width([5.0])) and math.isnan(ci_half_width([5.0, float("nan")]))


def runs(values: dict, trace="t", load=1.0) -> pd.DataFrame:
    """label → goodput of each replicate; every other metric equal."""
    rows = [{"trace": trace, "load": load, "label": label, "rate": 10.0, "ttft_slo": 2.0,
             **{m: 1.0 for m in METRICS}, "goodput (req/s)": g}
            for label, goodputs in values.items() for g in goodputs]
    return pd.DataFrame(rows)


def test_best_is_marked_within_trace_and_load_and_says_when_intervals_overlap():
    df = pd.concat([runs({"a": [10, 11, 12], "b": [1, 2, 3], "c": [10, 12, 14]}),
                    runs({"a": [1, 1.1, 1.2], "b": [50, 51, 52]}, load=4.0)], ignore_index=True)
    agg = aggregate(df)
    assert list(agg["n"]) == [3] * 5 and list(agg["load"]) == [1.0] * 3 + [4.0] * 2
    marks = {(agg.loc[i, "load"], agg.loc[i, "label"]): mark
             for (i, m), mark in best_marks(agg).items() if m == "goodput (req/s)"}
    assert marks.keys() == {(1.0, "c"), (4.0, "b")}
    assert marks[(1.0, "c")].overlaps == ("a",) and marks[(1.0, "c")].within_noise
    assert marks[(4.0, "b")].overlaps == () and not marks[(4.0, "b")].within_noise


def test_findings_name_identical_replicates_noise_and_light_load():
    df = runs({"a": [5, 5], "b": [5.1, 4.9]})
    df["KV peak (%)"], df["queueing p99 (s)"] = 7.0, 0.01
    agg = aggregate(df)
    notes = findings(df, agg, best_marks(agg))
    assert any("a on t at load ×1: its 2 replicates gave identical results" in n for n in notes)
    assert any("every configuration is within noise" in n for n in notes)
    assert any("light load: KV peaked at 7%" in n for n in notes)
    assert light_load(80.0, 0.01, 2.0) is None and light_load(7.0, 1.5, 2.0) is None


def test_compare_of_replicates_at_two_loads_writes_ci_table_load_figure_and_class_tables(tmp_path, capsys):
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
    table = pd.read_csv(out / "compare.csv")
    assert list(zip(table["load"], table["label"], table["n"])) == [(1.0, "a", 3), (1.0, "b", 3),
                                                                    (2.0, "a", 3), (2.0, "b", 3)]
    assert (table["SLO attainment (%) ±"] >= 0).all()
    for name in ("metric_vs_load", "cdf_compare"):
        assert (out / f"{name}.png").stat().st_size > 20_000 and len(pd.read_csv(out / f"{name}.csv")) > 0
    classes = pd.read_csv(out / "per_slo_class.csv")
    assert set(classes["group"]) == {"TTFT≤0.5s TPOT≤50ms"} and len(classes) == 4
    clients = pd.read_csv(out / "per_client.csv")
    assert set(clients["group"]) == {"c0", "c1", "c2"} and (clients["n"] == 3).all()
    markdown = (out / "compare.md").read_text()
    assert "## fixture at load ×1 (" in markdown and "## fixture at load ×2 (" in markdown
    assert " ± " in markdown and "## Per SLO class" in markdown and "![metric_vs_load](metric_vs_load.png)" in markdown
