"""Run plots and `python -m policylab compare` on real (simulated) run directories."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from policies.prefill_first import PrefillFirst
from policylab.analysis.compare import main as compare_main
from policylab.analysis.run_table import collect_runs, find_run_dirs
from policylab.core.config import EngineConfig, FairnessConfig, HardwareConfig, ModelConfig, SloConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.sim import SimDataPlane
from policylab.core.engine import Engine
from policylab.analysis.plots import cdf_points, downsample_steps, itl_values, write_run_plots
from policylab.core.request import TraceRequest
from policylab.analysis.results import write_results
from policylab.analysis.result_files import ResultSettings

LLAMA_8B_SHAPE = ModelConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                             num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                             tie_word_embeddings=False, dtype_bytes=2)


def make_run_dir(run_dir, n=60, rate=40.0, seed=0, num_blocks=96, ttft_slo=0.5, name="prefill_first",
                 overrides=None, trace_cfg=None):
    """Replay a seeded Poisson trace on the sim data plane and write the run's result files.

    A small KV cache (`num_blocks` of 16 tokens) forces preemptions; `overrides` are written
    as Hydra's `.hydra/overrides.yaml`, as a multirun job would have them.
    """
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    trace = [TraceRequest(float(a), int(rng.integers(16, 400)), int(rng.integers(2, 80)),
                          client=f"c{i % 3}") for i, a in enumerate(arrivals)]
    cfg = {"seed": seed, "policy": {"name": name}, "slo": {"ttft": ttft_slo, "tpot": 0.05},
           "fairness": {"w_in": 1.0, "w_out": 2.0}, "trace": trace_cfg or {"name": "fixture"}}
    dataplane = SimDataPlane(LLAMA_8B_SHAPE, HardwareConfig(), DataplaneConfig(kind="sim"), seed)
    engine = Engine(trace, PrefillFirst(name=name), dataplane,
                    EngineConfig(num_blocks=num_blocks, max_num_batched_tokens=512), seed=seed)
    write_results(run_dir, engine.run(), ResultSettings(SloConfig(**cfg["slo"]), FairnessConfig(**cfg["fairness"]), cfg))
    if overrides is not None:
        (run_dir / ".hydra").mkdir()
        (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    return run_dir


def test_itl_pools_gaps_within_each_request_only():
    times = [[0.0, 1.0, 3.0], [5.0], [], [2.0, 2.5]]
    assert list(itl_values(pd.DataFrame({"token_times": times}))) == [1.0, 2.0, 0.5]
    read_back = pd.DataFrame({"token_times": [np.array(t) for t in times]})    # as a results file gives them
    assert list(itl_values(read_back)) == [1.0, 2.0, 0.5]


def test_a_thinned_cdf_keeps_exact_points_of_the_whole_sample_ends_included():
    samples = np.random.default_rng(0).random(10_001)
    values, shares = cdf_points(samples, max_points=100)
    whole = np.sort(samples)
    at = np.searchsorted(whole, values)
    assert len(values) == 100 and values[0] == whole[0] and values[-1] == whole[-1] and shares[-1] == 1.0
    assert np.array_equal(values, whole[at]) and np.array_equal(shares, (at + 1) / whole.size)
    few, few_shares = cdf_points(samples[:3])
    assert list(few) == sorted(samples[:3]) and list(few_shares) == [1 / 3, 2 / 3, 1.0]


def test_downsample_steps_buckets_consecutive_steps():
    steps = pd.DataFrame({"step": range(10), "clock": np.arange(10) * 0.5, "duration": [0.5] * 10,
                          "waiting": range(10), "preempted": [0, 1, 0, 0, 2, 1, 0, 0, 0, 4]})
    small = downsample_steps(steps, 4)
    assert list(small["step"]) == [0, 3, 6, 9] and list(small["clock"]) == [0.0, 1.5, 3.0, 4.5]
    assert list(small["waiting"]) == [1.0, 4.0, 7.0, 9.0]          # means of 3, 3, 3, 1 steps
    assert list(small["preempted"]) == [1, 3, 0, 4] and list(small["duration"]) == [1.5, 1.5, 1.5, 0.5]
    assert downsample_steps(steps, 10).equals(steps)


def test_run_plots_are_written(tmp_path):
    paths = write_run_plots(make_run_dir(tmp_path, n=40))
    assert [p.name for p in paths] == ["latency_cdf.png", "latency_over_time.png", "timeline.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 20_000


def test_run_plots_of_a_run_where_nothing_ran(tmp_path):
    run_dir = make_run_dir(tmp_path, n=5, num_blocks=1)            # every request rejected: no steps
    assert pd.read_parquet(run_dir / "steps.parquet").empty
    assert all(p.stat().st_size > 5_000 for p in write_run_plots(run_dir))


@pytest.fixture
def multirun(tmp_path):
    """A Hydra-like multirun dir: 3 jobs, two policies' worth of overrides, one tight KV cache."""
    sweep = tmp_path / "multirun" / "12-00-00"
    jobs = [("0_a", 200, ["trace=fixture", "seed=0", "engine.num_blocks=200"]),
            ("1_b", 60, ["trace=fixture", "seed=0", "engine.num_blocks=60"]),
            ("10_c", 400, ["trace=fixture", "seed=0", "engine.num_blocks=400"])]
    for name, blocks, overrides in jobs:
        make_run_dir(sweep / name, n=50, rate=100.0, num_blocks=blocks, overrides=overrides)
    return sweep


def test_find_run_dirs_in_natural_order(multirun):
    assert [d.name for d in find_run_dirs([multirun.parent])] == ["0_a", "1_b", "10_c"]


def test_collect_runs_reads_summaries_and_varying_overrides(multirun):
    df, common = collect_runs(find_run_dirs([multirun]))
    assert common == ["trace=fixture", "seed=0"]
    assert list(df["params"]) == ["engine.num_blocks=200", "engine.num_blocks=60", "engine.num_blocks=400"]
    assert list(df["label"]) == [f"prefill_first engine.num_blocks={n}" for n in (200, 60, 400)]
    for row in df.itertuples():
        summary = json.loads((multirun / Path(row.run_dir).name / "summary.json").read_text())
        assert df.loc[row.Index, "TTFT p99 (ms)"] == pytest.approx(summary["ttft"]["p99"] * 1e3)
        assert df.loc[row.Index, "SLO attainment (%)"] == pytest.approx(summary["slo_attainment"] * 100)
        assert df.loc[row.Index, "preemptions"] == summary["preemptions"]


def test_compare_writes_table_cdfs_markdown_html(multirun, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert compare_main([str(multirun), "-o", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"compare.md", "compare.html", "compare.csv", "runs.csv", "findings.txt",
                                               "cdf_compare.png", "cdf_compare.csv", "per_slo_class.csv",
                                               "per_client.csv"}
    df = pd.read_csv(out / "compare.csv")
    assert len(df) == 3
    printed = capsys.readouterr().out
    assert "W&B report: skipped (offline" in printed and "engine.num_blocks=60" in printed
    most, fewest = df["preemptions"].idxmax(), df["preemptions"].idxmin()
    assert df.loc[most, "preemptions"] > df.loc[fewest, "preemptions"]
    table = [[c.strip() for c in line.strip("|").split("|")]
             for line in (out / "compare.md").read_text().splitlines() if line.startswith("| ")]
    column = [h.startswith("preemptions") for h in table[0]].index(True)
    assert table[1 + fewest][column] == f"**{int(df.loc[fewest, 'preemptions'])} ≈**"   # n = 1: no interval
    assert table[1 + most][column] == str(int(df.loc[most, "preemptions"]))
    assert "font-weight: bold" in (out / "compare.html").read_text()


def test_compare_reports_bad_paths(tmp_path, capsys):
    assert compare_main([str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert compare_main([str(tmp_path)]) == 2
    assert "no run directory (one with a summary.json)" in capsys.readouterr().err


def test_copies_of_results_inside_a_wandb_run_are_not_runs(tmp_path):
    run = tmp_path / "0_chunked_bursty"
    copy = run / "wandb" / "offline-run-1" / "files"
    copy.mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    (copy / "summary.json").write_text("{}")
    assert find_run_dirs([tmp_path]) == [run]


def test_cdf_lines_are_axes_ecdf_thinned_to_exact_points():
    from matplotlib.figure import Figure

    from policylab.analysis.plots import MAX_CDF_POINTS, cdf_row, line_styles
    samples = np.random.default_rng(0).lognormal(size=3 * MAX_CDF_POINTS)
    axes = Figure().subplots(1, 3)
    cdf_row(axes, {"run": {"TTFT": samples}}, {"TTFT": [0.5, 5.0]}, line_styles(["run"]))
    (line,) = [ln for ln in axes[0].get_lines() if ln.get_label() != "SLO 0.5 s" and "SLO" not in ln.get_label()]
    x, y = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
    assert len(x) <= 2 * MAX_CDF_POINTS + 2                           # thinned: no line of 12,000 steps
    exact = np.searchsorted(np.sort(samples), x[1:-1], side="right") / samples.size
    assert np.allclose(y[1:-1], exact)                              # every drawn step at its exact share
    assert {ln.get_label() for ln in axes[0].get_lines()} >= {"SLO 0.5 s", "SLO 5 s"}   # per-request SLOs


def test_compare_records_each_runs_cost_model_and_warns_when_runs_mix_them(tmp_path, capsys):
    a, b = make_run_dir(tmp_path / "runs" / "a", n=20), make_run_dir(tmp_path / "runs" / "b", n=20)
    for run_dir, cost_model in ((a, {"kind": "roofline", "hardware": "h100"}),
                                (b, {"kind": "profile", "file": "/p/mlp.csv", "sha256": "1a2b3c4d5e"})):
        summary = json.loads((run_dir / "summary.json").read_text())
        (run_dir / "summary.json").write_text(json.dumps({**summary, "cost_model": cost_model}))
    assert compare_main([str(tmp_path / "runs"), "-o", str(tmp_path / "cmp")]) == 0
    warning = "mix cost models (roofline h100, profile mlp.csv@1a2b3c4d)"
    assert warning in capsys.readouterr().err
    assert warning in (tmp_path / "cmp" / "compare.md").read_text()
    runs = pd.read_csv(tmp_path / "cmp" / "runs.csv")
    assert sorted(runs["cost_model"]) == ["profile mlp.csv@1a2b3c4d", "roofline h100"]
