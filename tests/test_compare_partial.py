"""`compare` with partial runs (stopped early: only the requests that ended are measured, which
look fast): marked in every table, never ranked; damaged result files: one line naming the file."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from policies.prefill_first import PrefillFirst
from policylab.analysis.compare import main as compare_main
from policylab.analysis.results import write_results
from policylab.core.config import EngineConfig, FairnessConfig, HardwareConfig, SloConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.core.engine import Engine
from policylab.core.request import TraceRequest
from policylab.dataplane.sim import SimDataPlane
from policylab.analysis.result_files import ResultSettings
from tests.test_plots_compare import LLAMA_8B_SHAPE, make_run_dir

pytestmark = pytest.mark.timeout(120)


class StopsAfter(PrefillFirst):
    """PrefillFirst that raises at its `steps`-th decision: a partial run with a few requests done."""

    def __init__(self, steps: int, name: str = "prefill_first"):
        super().__init__(name=name)
        self.left = steps

    def schedule(self, view):
        self.left -= 1
        if self.left < 0:
            raise RuntimeError("policy crashed")
        return super().schedule(view)


def partial_run_dir(run_dir, steps: int, overrides, n=50, rate=100.0, seed=0):
    rng = np.random.default_rng(seed)           # the same trace as make_run_dir's
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    trace = [TraceRequest(float(a), int(rng.integers(16, 400)), int(rng.integers(2, 80)),
                          client=f"c{i % 3}") for i, a in enumerate(arrivals)]
    cfg = {"seed": seed, "policy": {"name": "prefill_first"}, "slo": {"ttft": 0.5, "tpot": 0.05},
           "fairness": {"w_in": 1.0, "w_out": 2.0}, "trace": {"name": "fixture"}}
    plane = SimDataPlane(LLAMA_8B_SHAPE, HardwareConfig(), DataplaneConfig(kind="sim"), seed)
    result = Engine(trace, StopsAfter(steps), plane, EngineConfig(num_blocks=60, max_num_batched_tokens=512),
                    seed=seed).run()
    assert result.partial
    write_results(run_dir, result, ResultSettings(SloConfig(**cfg["slo"]), FairnessConfig(**cfg["fairness"]), cfg))
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    return run_dir


@pytest.fixture
def sweep(tmp_path):
    """Two complete runs (a tight and an ample KV cache) and two that stopped after a few steps."""
    root = tmp_path / "sweep"
    make_run_dir(root / "0_tight", n=50, rate=100.0, num_blocks=60,
                 overrides=["trace=fixture", "engine.num_blocks=60"])
    make_run_dir(root / "1_ample", n=50, rate=100.0, num_blocks=400,
                 overrides=["trace=fixture", "engine.num_blocks=400"])
    partial_run_dir(root / "2_stopped", 12, ["trace=fixture", "engine.max_num_seqs=8"])
    partial_run_dir(root / "3_stopped_early", 4, ["trace=fixture", "engine.max_num_seqs=4"])
    return root


def _md_rows(path, first_table_only=False) -> list:
    rows = []
    for line in path.read_text().splitlines():
        if line.startswith("|:"):
            continue
        if line.startswith("| "):
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif rows and first_table_only:
            break
    return rows


def test_partial_runs_are_marked_everywhere_and_never_best(sweep, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert compare_main([str(sweep), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    runs = pd.read_csv(out / "runs.csv")
    stopped = runs[runs["partial"]]
    assert len(stopped) == 2 and all(stopped["label"].str.endswith("(partial)"))
    finished = [int(f.split("/")[0]) for f in stopped["finished"]]
    assert max(finished) < 50
    # the fast-looking partial runs would win TTFT p99 if ranked
    complete = runs[~runs["partial"]]
    assert stopped["TTFT p99 (ms)"].min() < complete["TTFT p99 (ms)"].min()

    rows = _md_rows(out / "compare.md", first_table_only=True)
    header = rows[0]
    ttft = [h.startswith("TTFT p99") for h in header].index(True)
    by_label = {r[0]: r for r in rows[1:]}
    partial_rows = [r for label, r in by_label.items() if label.endswith("(partial)")]
    assert len(partial_rows) >= 2
    for r in partial_rows:                               # no cell of a partial run is bold
        assert not any(c.startswith("**") for c in r[1:]), r
    best = [label for label, r in by_label.items() if r[ttft].startswith("**")]
    assert best and not any(b.endswith("(partial)") for b in best)
    md = (out / "compare.md").read_text()
    assert "never ranked" in md and md.count("is a partial run") == 2
    per_client = pd.read_csv(out / "per_client.csv")
    assert per_client["label"].str.endswith("(partial)").sum() > 0    # the breakdowns mark them too
    assert "(partial)" in (out / "compare.html").read_text()
    assert "(partial)" in captured.out and "RuntimeError: policy crashed" in captured.err


def test_only_one_complete_run_per_group_ranks_nothing(sweep, tmp_path):
    """One complete run against partial ones: nothing to rank it against, so no cell is bold."""
    (sweep / "1_ample" / "summary.json").unlink()
    out = tmp_path / "cmp"
    assert compare_main([str(sweep), "-o", str(out)]) == 0
    assert "**" not in "".join("".join(r) for r in _md_rows(out / "compare.md"))


@pytest.mark.parametrize("name,damage", [("summary.json", lambda b: b[: len(b) // 2]),
                                         ("summary.json", lambda b: b"[1, 2]"),
                                         ("requests.parquet", lambda b: b[: len(b) // 2]),
                                         ("requests.parquet", lambda b: b"")])
def test_a_damaged_result_file_is_one_line_naming_it(sweep, tmp_path, capsys, name, damage):
    path = sweep / "0_tight" / name
    path.write_bytes(damage(path.read_bytes()))
    assert compare_main([str(sweep), "-o", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path}: ") and "Traceback" not in err[0]


def test_summary_marks_the_run_partial(sweep):
    summary = json.loads((sweep / "2_stopped" / "summary.json").read_text())
    assert summary["partial"] and summary["status"] == "partial"


def test_printed_table_fits_120_columns_and_drops_empty_columns(sweep, tmp_path, capsys):
    assert compare_main([str(sweep), "-o", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    table = out.split("wrote ")[0]
    assert max(len(line) for line in table.splitlines()) <= 120
    assert "imbal." not in table and "GPU" not in table             # cluster columns: no cluster run
    assert "engine.num_blocks=400" in table                        # labels are not cut
    page = (tmp_path / "cmp" / "compare.html").read_text()
    assert page.count('<div class="table-wrap">') == page.count("<table") >= 1   # each table scrolls in its box
    assert ".table-wrap{overflow-x:auto" in page and "load imbalance" not in page
