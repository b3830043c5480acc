"""`policylab.replay` / `policylab.compare` / `policylab.Run`: the CLI's jobs from Python, with
the CLI's config groups and keys, results as objects, a policy class passed directly."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import policylab
from policylab.apps.cli import main
from policylab.apps.config import ConfigError
from policylab.apps.python_api import _hydra_value
from policies.chunked import Chunked

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[1]
SIM = dict(dataplane="sim", logger="none", progress=False, plots=False)


def test_replay_returns_the_run_as_objects(tmp_path):
    run = policylab.replay(policy="chunked", trace="bursty", trace__max_requests=40, dir=tmp_path, **SIM)
    assert isinstance(run, policylab.Run) and run.dir == tmp_path and run.status == "complete"
    assert run.summary == json.loads((tmp_path / "summary.json").read_text())
    assert run.summary["policy"] == "chunked" and run.summary["counts"]["finished"] == 40
    assert isinstance(run.requests, pd.DataFrame) and len(run.requests) == 40
    assert isinstance(run.steps, pd.DataFrame) and run.steps["step"].is_monotonic_increasing
    assert run.plots == {}                                                   # plots=false
    reread = policylab.Run(tmp_path)
    pd.testing.assert_frame_equal(reread.requests, run.requests)
    assert "chunked on bursty, complete" in repr(reread)


def test_replay_is_the_cli_run_with_the_same_overrides(tmp_path):
    overrides = ["policy=chunked", "trace=multitenant", "policy.chunk_size=128", "trace.rate_scale=16",
                 "engine.max_num_seqs=32", "dataplane=sim", "logger=none", "progress=false", "plots=false"]
    main(["run", *overrides, f"hydra.run.dir={tmp_path / 'cli'}"])
    api = policylab.replay("chunked", "multitenant", dir=tmp_path / "api", engine={"max_num_seqs": 32},
                           trace__rate_scale=16, **{"policy.chunk_size": 128}, **SIM)
    cli = policylab.Run(tmp_path / "cli")
    pd.testing.assert_frame_equal(api.requests, cli.requests)
    assert api.summary["config"] == cli.summary["config"]
    assert api.summary["ttft"] == cli.summary["ttft"] and api.summary["goodput"] == cli.summary["goodput"]


def test_a_policy_class_defined_anywhere_runs_with_its_constructor_arguments(tmp_path):
    class LongestFirst(Chunked):                   # a local class: no import reaches it
        def __init__(self, name=None, chunk_size=512, reverse=True):
            super().__init__(name or "longest_first", chunk_size)
            self.reverse = reverse

        def admission_order(self, view):
            return sorted(view.waiting, key=lambda v: v.prompt_len, reverse=self.reverse)

    run = policylab.replay(LongestFirst, "multitenant", dir=tmp_path / "class", trace__rate_scale=16,
                           policy__chunk_size=128, policy__reverse=False, **SIM)
    spec = run.summary["config"]["policy"]
    assert run.summary["policy"] == "LongestFirst" and spec["chunk_size"] == 128 and spec["reverse"] is False
    assert spec["policy_class"].endswith("LongestFirst")
    # reverse=False is shortest-first: not the same schedule as plain chunked (FCFS) at this load
    fcfs = policylab.replay("chunked", "multitenant", dir=tmp_path / "fcfs", trace__rate_scale=16,
                            policy__chunk_size=128, **SIM)
    assert run.summary["ttft"] != fcfs.summary["ttft"]


def test_an_importable_shipped_class_runs_like_its_config_name(tmp_path):
    by_class = policylab.replay(Chunked, "bursty", dir=tmp_path / "a", trace__max_requests=60, **SIM)
    by_name = policylab.replay("chunked", "bursty", dir=tmp_path / "b", trace__max_requests=60, **SIM)
    pd.testing.assert_frame_equal(by_class.requests, by_name.requests)


def test_bad_keys_and_options_are_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="did you mean trace.max_requests"):
        policylab.replay("chunked", "bursty", dir=tmp_path, trace__max_request=10, **SIM)
    with pytest.raises(ConfigError, match="policy"):
        policylab.replay("no_such_policy", "bursty", dir=tmp_path, **SIM)
    with pytest.raises(Exception, match="Policy class"):
        policylab.replay(42, "bursty", dir=tmp_path, **SIM)


def test_override_values_survive_hydras_grammar():
    assert _hydra_value(None) == "null" and _hydra_value(True) == "true" and _hydra_value(0.5) == "0.5"
    assert _hydra_value([1, 2]) == "[1,2]" and _hydra_value("traces/a b.jsonl") == "'traces/a b.jsonl'"
    assert _hydra_value("it's") == "'it\\'s'" and _hydra_value("sim") == "sim"


def test_replay_is_quiet_unless_asked(tmp_path, capsys):
    """A notebook replaying five policies gets five transient progress bars, not five summaries."""
    quiet = dict(SIM, progress=True)
    policylab.replay(policy="chunked", trace="bursty", trace__max_requests=20, dir=tmp_path / "quiet", **quiet)
    out, err = capsys.readouterr()
    assert out == "" and "latency" not in err and "results:" not in err
    policylab.replay(policy="chunked", trace="bursty", trace__max_requests=20, dir=tmp_path / "told", verbose=True,
                     **quiet)
    out, _ = capsys.readouterr()
    assert "policy chunked: latency (ms)" in out and f"results: {tmp_path / 'told'}" in out


def test_compare_returns_the_table_with_intervals_and_writes_the_report(tmp_path, capsys):
    runs = [policylab.replay(p, "multitenant", dir=tmp_path / f"{p}_{k}", trace__rate_scale=24,
                             trace__replicate=k, **SIM)
            for p in ("prefill_first", "slo_aware") for k in (1, 2)]
    capsys.readouterr()
    table = policylab.compare(runs, out=tmp_path / "cmp")
    printed = capsys.readouterr().out
    assert "configuration" not in printed and "wrote " not in printed          # the table is returned, not printed
    assert table.attrs["findings"] and all(line in printed for line in table.attrs["findings"]
                                           if "SLO attainment (%) (higher" in line)
    assert sorted(table["label"]) == ["prefill_first", "slo_aware"] and set(table["n"]) == {2}
    assert "SLO attainment (%) ±" in table and table["SLO attainment (%) ±"].notna().all()
    assert (table["SLO attainment (%) low"] >= 0).all() and (table["SLO attainment (%) high"] <= 100).all()
    assert table.attrs["report"] == tmp_path / "cmp" / "compare.md" and table.attrs["report"].is_file()
    mean = table.set_index("label")["SLO attainment (%)"]
    pooled = [r.summary["slo_attainment"] * 100 for r in runs[:2]]
    assert mean["prefill_first"] == pytest.approx(sum(pooled) / 2)
    assert len(policylab.compare(tmp_path / "prefill_first_1", out=tmp_path / "one")) == 1   # a directory


def test_run_cdf_draws_the_finished_requests(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    run = policylab.replay("prefill_first", "bursty", dir=tmp_path, trace__max_requests=30, **SIM)
    ax = run.cdf("ttft")
    x, y = ax.lines[0].get_data()
    assert len(x) == 30 and y[-1] == 1.0 and list(x) == sorted(run.requests["ttft"])
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        policylab.Run(tmp_path / "nothing")


def test_import_policylab_loads_neither_hydra_nor_torch_nor_pandas():
    code = "import sys, policylab; print(sorted(m for m in ('hydra', 'torch', 'pandas') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         timeout=120)
    assert out.stdout.strip() == "[]"
    assert callable(policylab.replay) and callable(policylab.compare)


def test_a_policy_that_raises_returns_a_partial_run_with_every_request_written(tmp_path):
    from policies.prefill_first import PrefillFirst

    class RaisesAtStep50(PrefillFirst):
        def schedule(self, view):
            if view.step == 50:
                raise RuntimeError("exploded at step 50")
            return super().schedule(view)

    run = policylab.replay(RaisesAtStep50, "bursty", dir=tmp_path, **SIM)
    assert run.status == "partial" and "exploded at step 50" in run.error
    assert len(run.requests) == 200 and "unfinished" in set(run.requests["status"])
