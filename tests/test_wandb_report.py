"""`compare --wandb-online` against a stubbed W&B (no W&B server is reachable here): it uploads
the offline runs itself, logs the comparison run, and the report shows its figures and tables."""
from __future__ import annotations

import json
import sys
import types

import pytest

from policylab.analysis import wandb_report
from policylab.analysis.compare import main as compare_main
from policylab.analysis.tracking import RUN_INFO_FILE
from tests.test_plots_compare import make_run_dir
from tests.test_tracking import stub_wandb

pytestmark = pytest.mark.timeout(120)


class Api:
    api_key, default_entity = "key", "me"


def stub_with_runs(monkeypatch, tmp_path):
    """stub_wandb plus wandb.init (a recording comparison run) and the report panels used here."""
    saved = stub_wandb(monkeypatch, Api)
    wandb, wr = sys.modules["wandb"], sys.modules["wandb_workspaces.reports.v2"]
    logged = []

    class Run:
        id, project, entity, url = "cmp42", "policylab", "me", "https://wandb.ai/me/policylab/runs/cmp42"

        def __init__(self, **kwargs):
            self.kwargs, self.dir = kwargs, str(tmp_path / "wandb_cmp" / "files")
            (tmp_path / "wandb_cmp" / "files").mkdir(parents=True, exist_ok=True)

        def log(self, media):
            logged.append(media)

        def finish(self):
            pass
    wandb.init = lambda **kw: Run(**kw)
    wandb.Settings = lambda **kw: kw
    wandb.Table = lambda dataframe=None, **kw: ("Table", dataframe)
    wandb.Image = lambda path: ("Image", path)
    wandb.teardown = lambda: None
    for name in ("MediaBrowser", "WeavePanelSummaryTable", "H2"):
        setattr(wr, name, lambda *a, _n=name, **k: (_n, a, k))
    return saved, logged


def sweep(tmp_path):
    """Two policies at two loads, each run 'logged offline' (a wandb_run.json as the tracker writes it)."""
    root = tmp_path / "sweep"
    k = 0
    for rate in (40.0, 80.0):
        for blocks in (60, 400):
            run = make_run_dir(root / f"{k}_run", n=30, rate=rate, num_blocks=blocks,
                               overrides=[f"trace.rate_scale={rate / 40:g}", f"engine.num_blocks={blocks}"],
                               trace_cfg={"name": "fixture", "rate_scale": rate / 40})
            (run / RUN_INFO_FILE).write_text(json.dumps({"id": f"r{k}", "project": "policylab", "entity": None,
                                                         "mode": "offline", "dir": str(run / "wandb" / f"r{k}")}))
            k += 1
    return root


@pytest.mark.slow
def test_wandb_online_uploads_offline_runs_and_reports_figures_and_tables(tmp_path, monkeypatch, capsys):
    saved, logged = stub_with_runs(monkeypatch, tmp_path)
    uploads = []
    monkeypatch.setattr(wandb_report, "wandb_sync", uploads.append)
    root = sweep(tmp_path)
    assert compare_main([str(root), "-o", str(tmp_path / "cmp"), "--wandb-online"]) == 0
    out = capsys.readouterr().out
    assert sorted(uploads) == sorted(str(root / f"{k}_run" / "wandb" / f"r{k}") for k in range(4))
    assert all(json.loads((root / f"{k}_run" / RUN_INFO_FILE).read_text())["mode"] == "synced" for k in range(4))
    assert "W&B report: https://wandb.ai/me/policylab/reports/r1 (4 offline runs uploaded first)" in out
    (media,) = logged                                       # the comparison run: tables and figures
    assert {"compare", "per_slo_class", "per_client"} <= set(media)
    assert {"figures/metric_vs_load", "figures/cdf_compare"} <= set(media)
    (report,) = saved
    blocks = report.kwargs["blocks"]
    assert blocks[2][0] == "H2" and blocks[3][0] == "PanelGrid"
    own_runset, panels = blocks[3][2]["runsets"][0], blocks[3][2]["panels"]
    assert "'cmp42'" in own_runset[2]["filters"]
    (browser,) = [p for p in panels if p[0] == "MediaBrowser"]
    assert {"figures/metric_vs_load", "figures/cdf_compare"} <= set(browser[2]["media_keys"])
    assert {p[2]["table_name"] for p in panels if p[0] == "WeavePanelSummaryTable"} == \
        {"compare", "per_slo_class", "per_client"}
    # a second compare uploads nothing again
    uploads.clear()
    assert compare_main([str(root), "-o", str(tmp_path / "cmp2"), "--wandb-online"]) == 0
    assert uploads == [] and "uploaded first" not in capsys.readouterr().out


@pytest.mark.slow
def test_a_failed_upload_is_one_sentence_and_no_report(tmp_path, monkeypatch, capsys):
    saved, _ = stub_with_runs(monkeypatch, tmp_path)
    done = types.SimpleNamespace(returncode=1, stdout="", stderr="wandb: ERROR network unreachable\n")
    monkeypatch.setattr(wandb_report.subprocess, "run", lambda *a, **k: done)
    root = sweep(tmp_path)
    assert compare_main([str(root), "-o", str(tmp_path / "cmp"), "--wandb-online"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and "wandb sync" in err[0] and "network unreachable" in err[0] and saved == []
    assert json.loads((root / "0_run" / RUN_INFO_FILE).read_text())["mode"] == "offline"
