"""W&B tracking, offline: what lands in the run's `.wandb` log equals the local result files.

The only test module that imports wandb (slow). The `.wandb` file is a leveldb-style log
of `wandb_internal_pb2.Record` protobufs, decoded here by `wandb_records`.
"""
from __future__ import annotations

import json
import math
import struct
import sys
import zlib
from pathlib import Path

import pandas as pd
import pytest

from policylab.analysis.metrics import flatten
from policylab.analysis.plots import write_run_plots
from policylab.analysis.tracking import RUN_INFO_FILE, NullTracker, open_tracker
from policylab.apps.config import PolicySpec, RunConfig
from policylab.core.config import LoggerConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.traces import TraceConfig
from policylab.analysis.result_files import ResultSettings
from policylab.apps.settings import tracker_settings
from tests.test_plots_compare import make_run_dir

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list:
    """Every record of a `.wandb` file, checksums verified."""
    from wandb.proto.wandb_internal_pb2 import Record
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    records, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:          # a block's tail too short for a header: padding
            pos += BLOCK - pos % BLOCK
            continue
        checksum, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0:
            break
        chunk = data[pos + HEADER:pos + HEADER + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == checksum, f"bad checksum at {pos}"
        pending, pos = pending + chunk, pos + HEADER + length
        if kind in (FULL, LAST):
            record = Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def item_value(item):
    """A history/summary/config item's value (JSON-encoded or typed, by wandb version)."""
    kind = item.WhichOneof("value") if "value" in [o.name for o in item.DESCRIPTOR.oneofs] else None
    if kind and kind != "value_json":
        return getattr(item, kind)
    return json.loads(item.value_json)


def item_key(item) -> str:
    return item.key or "/".join(item.nested_key)


def logged(wandb_file: Path) -> dict:
    """history rows (step, {key: value}), last summary and config, run tags and group."""
    out = {"history": [], "summary": {}, "config": {}, "tags": [], "group": None}
    for r in wandb_records(wandb_file):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            out["history"].append((r.history.step.num,
                                   {item_key(i): item_value(i) for i in r.history.item}))
        elif kind == "summary":
            out["summary"].update({item_key(i): item_value(i) for i in r.summary.update})
        elif kind == "config":
            out["config"].update({item_key(i): item_value(i) for i in r.config.update})
        elif kind == "run":
            out["tags"], out["group"] = list(r.run.tags), r.run.run_group
            out["config"].update({item_key(i): item_value(i) for i in r.run.config.update})
    return out


def run_cfg(logger: dict) -> RunConfig:
    """The typed config the app layer hands the tracker."""
    return RunConfig(policy=PolicySpec(name="prefill_first", chunk=7), trace=TraceConfig(name="fixture"),
                     dataplane=DataplaneConfig(kind="sim"),
                     logger=LoggerConfig(**{"project": "policylab-test", "tags": ["extra"], **logger}))


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    run_dir = make_run_dir(tmp_path_factory.mktemp("run"), n=80, rate=100.0, num_blocks=200)
    write_run_plots(run_dir)
    tracker = open_tracker(tracker_settings(run_cfg({"max_history_points": 50, "group": "sweep-7"})), run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    tracker.log_run(run_dir, summary)
    tracker.finish()
    info = json.loads((run_dir / RUN_INFO_FILE).read_text())
    (wandb_file,) = Path(info["dir"]).glob("run-*.wandb")
    return run_dir, summary, info, logged(wandb_file)


def test_summary_metrics_equal_summary_json(logged_run):
    _, summary, _, log = logged_run
    metrics = flatten({k: v for k, v in summary.items() if k != "config"})
    expected = {k: v for k, v in metrics.items() if v is not None}
    assert {"ttft/p99", "tpot/p50", "goodput", "slo_attainment", "throughput/output_tokens_per_s",
            "counts/finished"} <= expected.keys()
    for key, value in expected.items():
        assert log["summary"][key] == pytest.approx(value), key


def test_history_is_steps_parquet_bucketed_to_max_points(logged_run):
    run_dir, _, _, log = logged_run
    steps = pd.read_parquet(run_dir / "steps.parquet")
    rows = [(step, row) for step, row in log["history"] if "engine/clock" in row]
    per_bucket = math.ceil(len(steps) / 50)
    assert per_bucket > 1 and len(rows) == math.ceil(len(steps) / per_bucket) <= 50
    for b, (step, row) in enumerate(rows):
        bucket = steps.iloc[b * per_bucket:(b + 1) * per_bucket]
        assert step == bucket["step"].iloc[0]
        assert row["engine/clock"] == pytest.approx(bucket["clock"].iloc[0])
        assert row["engine/preempted"] == pytest.approx(bucket["preempted"].sum())
        for column in ("batch_size", "prefill_tokens", "decode_tokens", "kv_utilization",
                       "waiting", "running"):
            assert row[f"engine/{column}"] == pytest.approx(bucket[column].mean()), column


def test_config_tags_group_table_and_plots(logged_run):
    run_dir, summary, info, log = logged_run
    assert log["config"]["policy"] == {"name": "prefill_first", "chunk": 7}
    assert log["tags"] == ["prefill_first", "fixture", "extra"] and log["group"] == "sweep-7"
    assert Path(info["dir"]).is_relative_to(run_dir) and info["mode"] == "offline"
    media = [row for _, row in log["history"] if "requests/path" in row]     # media: nested keys
    assert len(media) == 1
    images = {k for k, v in media[0].items() if k.startswith("plots/") and k.endswith("/_type")}
    assert images == {f"plots/{name}/_type" for name in ("latency_cdf", "latency_over_time", "timeline")}
    for image in images:
        assert media[0][image] == "image-file"
        assert (Path(info["dir"]) / "files" / media[0][image.replace("_type", "path")]).is_file()
    table = json.loads((Path(info["dir"]) / "files" / media[0]["requests/path"]).read_text())
    requests = pd.read_parquet(run_dir / "requests.parquet")
    assert len(table["data"]) == len(requests) == summary["counts"]["requests"]
    assert "token_times" not in table["columns"]
    shown = requests[table["columns"]]
    assert table["data"] == shown.astype(object).where(shown.notna(), None).to_numpy().tolist()   # every cell


def test_table_column_types_are_those_wandb_infers_and_checked(logged_run):
    """The requests table declares its column types from the frame's dtypes instead of letting W&B
    infer them cell by cell: the same types W&B infers (missing values included), and a row that
    contradicts them is refused by W&B, not logged."""
    import wandb
    from policylab.analysis.tracking import column_type, typed_table
    requests = pd.read_parquet(logged_run[0] / "requests.parquet").drop(columns=["token_times"])
    requests.loc[1, "ttft"] = None                                  # a missing number
    rows = requests.astype(object).where(requests.notna(), None).to_numpy().tolist()
    columns, types = list(requests.columns), [column_type(requests[c]) for c in requests]
    inferred, declared = wandb.Table(columns=columns, data=rows), typed_table(wandb, columns, types, rows)
    assert declared._column_types.params == inferred._column_types.params and declared.data == rows
    assert {c: t for c, t in zip(columns, types)}["slo_met"] is bool and types[columns.index("status")] is str
    bad = [list(rows[0])]
    bad[0][columns.index("ttft")] = "fast"                           # a string in a number column
    with pytest.raises(TypeError):
        typed_table(wandb, columns, types, bad)


def test_wandb_that_cannot_start_warns_once_and_run_goes_on(tmp_path, monkeypatch, capsys):
    import wandb

    def no_network(**kwargs):
        raise wandb.errors.CommError("cannot reach api.wandb.ai")
    monkeypatch.setattr(wandb, "init", no_network)
    tracker = open_tracker(tracker_settings(run_cfg({"mode": "online"})), tmp_path)
    tracker.log_run(tmp_path, {})
    tracker.finish()
    assert isinstance(tracker, NullTracker)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CommError" in err[0] and str(tmp_path) in err[0]


def test_wandb_failing_mid_run_warns_once(tmp_path, capsys):
    run_dir = make_run_dir(tmp_path / "run", n=10)
    tracker = open_tracker(tracker_settings(run_cfg({})), run_dir)
    capsys.readouterr()

    def broken_log(*args, **kwargs):
        raise OSError("disk full")
    tracker.run.log = broken_log
    tracker.log_run(run_dir, json.loads((run_dir / "summary.json").read_text()))
    tracker.log_run(run_dir, {})
    tracker.finish()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "W&B logging failed (OSError: disk full)" in err[0]


def test_logger_none_never_imports_wandb(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)          # any `import wandb` now fails
    for logger in ({"kind": "none"}, {"mode": "disabled"}):
        tracker = open_tracker(tracker_settings(run_cfg(logger)), tmp_path)
        tracker.log_run(tmp_path, {})
        tracker.finish()
        assert isinstance(tracker, NullTracker)
    assert list(tmp_path.iterdir()) == [] and capsys.readouterr().err == ""   # no "W&B did not start"


def test_unknown_logger_kind_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="logger.kind must be 'wandb' or 'none', got 'tensorboard'"):
        open_tracker(tracker_settings(run_cfg({"kind": "tensorboard"})), tmp_path)


def test_engine_summary_holds_whole_run_aggregates_not_the_last_step(logged_run):
    run_dir, _, _, log = logged_run
    steps = pd.read_parquet(run_dir / "steps.parquet")
    assert log["summary"]["engine/kv_utilization"] == pytest.approx(steps["kv_utilization"].mean())
    assert log["summary"]["engine/kv_utilization_max"] == pytest.approx(steps["kv_utilization"].max())
    assert log["summary"]["engine/preempted"] == steps["preempted"].sum() > 0
    assert log["summary"]["engine/duration"] == pytest.approx(steps["duration"].sum())


def stub_wandb(monkeypatch, api):
    """A `wandb` whose Api() is `api` (a class, or a function raising), and a recording reports API."""
    import types
    saved = []
    wandb = types.ModuleType("wandb")
    wandb.Api = api
    wr = types.ModuleType("wandb_workspaces.reports.v2")
    for name in ("Runset", "BarPlot", "SummaryMetric", "PanelGrid", "RunComparer", "MarkdownBlock"):
        setattr(wr, name, lambda *a, _n=name, **k: (_n, a, k))

    class Report:
        def __init__(self, **kwargs):
            self.kwargs, self.url = kwargs, "https://wandb.ai/me/policylab/reports/r1"

        def save(self):
            saved.append(self)
    wr.Report = Report
    parent = types.ModuleType("wandb_workspaces")
    parent.reports = types.ModuleType("wandb_workspaces.reports")
    parent.reports.v2 = wr
    for name, module in (("wandb", wandb), ("wandb_workspaces", parent),
                         ("wandb_workspaces.reports", parent.reports), ("wandb_workspaces.reports.v2", wr)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    return saved


def run_with_info(tmp_path, mode="offline"):
    run_dir = make_run_dir(tmp_path / "0_a", n=10)
    (run_dir / RUN_INFO_FILE).write_text(json.dumps({"id": "abc123", "project": "policylab", "entity": None,
                                                     "mode": mode, "dir": str(run_dir / "wandb")}))
    (tmp_path / "compare.md").write_text("# table\n![cdf](cdf.png)\n")
    return run_dir


def test_create_report_builds_a_report_of_the_runs(tmp_path, monkeypatch):
    from policylab.analysis.tracking import create_report

    class Api:
        api_key, default_entity = "key", "me"
    saved = stub_wandb(monkeypatch, Api)
    message = create_report([run_with_info(tmp_path)], [("goodput",), ("ttft", "p99")], tmp_path / "compare.md")
    assert message.startswith("W&B report: https://wandb.ai/me/policylab/reports/r1") and "wandb sync" in message
    (report,) = saved
    assert report.kwargs["entity"] == "me" and report.kwargs["project"] == "policylab"
    markdown, grid = report.kwargs["blocks"]
    assert markdown[2]["text"] == "# table"                      # local image links left out
    runset, panels = grid[2]["runsets"][0], grid[2]["panels"]
    assert "'abc123'" in runset[2]["filters"]
    assert [p[2]["title"] for p in panels[:2]] == ["goodput", "ttft/p99"] and panels[2][0] == "RunComparer"


@pytest.mark.parametrize("why, api, env", [
    ("not logged in", "raises", None), ("not logged in", "no key", None), ("W&B is offline here", "ok", "offline")])
def test_compare_wandb_online_fails_with_one_sentence(tmp_path, monkeypatch, capsys, why, api, env):
    from policylab.analysis.compare import main as compare_main

    def raises():
        raise RuntimeError("api_key not configured (no-tty). call wandb.login(key=[your_api_key])")
    apis = {"raises": raises, "no key": type("Api", (), {"api_key": None}),
            "ok": type("Api", (), {"api_key": "k", "default_entity": "me"})}
    saved = stub_wandb(monkeypatch, apis[api])
    if env:
        monkeypatch.setenv("WANDB_MODE", env)
    run_with_info(tmp_path)
    assert compare_main([str(tmp_path / "0_a"), "-o", str(tmp_path / "cmp"), "--wandb-online"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and err[0].startswith("error: W&B report not created: ") and why in err[0]
    assert "Traceback" not in err[0] and saved == [] and (tmp_path / "cmp" / "compare.md").is_file()


def test_a_job_result_is_logged_with_its_table_and_figure(tmp_path):
    run_dir = make_run_dir(tmp_path / "capacity", n=10)
    (png,) = write_run_plots(run_dir)[:1]
    tracker = open_tracker(tracker_settings(run_cfg({})), run_dir, name="capacity_prefill_first_fixture trace.max_requests=10")
    tracker.log_result({"capacity": {"rate": 12.5, "status": "found"}},
                       {"capacity_curve": pd.DataFrame({"rate": [1.0, 2.0], "slo_attainment": [1.0, 0.5]})}, [png])
    tracker.finish()
    info = json.loads((run_dir / RUN_INFO_FILE).read_text())
    (wandb_file,) = Path(info["dir"]).glob("run-*.wandb")
    log = logged(wandb_file)
    assert log["summary"]["capacity/rate"] == 12.5 and log["summary"]["capacity/status"] == "found"
    media = [row for _, row in log["history"] if "capacity_curve/path" in row]
    assert len(media) == 1 and "plots/latency_cdf/path" in media[0]
    names = [r.run.display_name for r in wandb_records(wandb_file) if r.WhichOneof("record_type") == "run"]
    assert names[0] == "capacity_prefill_first_fixture trace.max_requests=10"


def test_compare_logs_the_comparison_as_a_wandb_run(tmp_path, capsys):
    from policylab.analysis.compare import main as compare_main
    sweep = tmp_path / "2026-01-02" / "10-11-12"
    for job, blocks in ((0, 400), (1, 60)):
        make_run_dir(sweep / f"{job}_prefill_first_fixture", n=20, num_blocks=blocks,
                     overrides=[f"engine.num_blocks={blocks}"])
    assert compare_main([str(sweep), "-o", str(tmp_path / "cmp"), "--log-wandb"]) == 0
    assert "W&B comparison run: " in capsys.readouterr().out
    (wandb_file,) = (tmp_path / "cmp" / "wandb").glob("offline-run-*/run-*.wandb")
    log = logged(wandb_file)
    assert log["group"] == "2026-01-02_10-11-12"
    media = [row for _, row in log["history"] if "compare/path" in row]
    assert len(media) == 1 and "per_slo_class/path" in media[0] and "figures/cdf_compare/path" in media[0]
    files = wandb_file.parent / "files"
    assert (files / "compare.md").is_file() and (files / "compare.csv").is_file()


def test_pd_pool_policies_in_the_tags_and_config(tmp_path):
    from policylab.cluster import ClusterConfig
    cfg = run_cfg({})
    cfg.router = PolicySpec(name="least_loaded")
    cfg.cluster = ClusterConfig(prefill_replicas=1, decode_replicas=2,
                                prefill_policy=PolicySpec(name="chunked", chunk_size=2048),
                                decode_policy=PolicySpec(name="decode_first"))
    tracker = open_tracker(tracker_settings(cfg), tmp_path)
    tracker.finish()
    info = json.loads((tmp_path / RUN_INFO_FILE).read_text())
    (wandb_file,) = Path(info["dir"]).glob("run-*.wandb")
    log = logged(wandb_file)
    assert log["tags"] == ["chunked+decode_first", "fixture", "extra", "router:least_loaded", "replicas:3",
                           "prefill_policy:chunked", "decode_policy:decode_first"]
    pools = log["config"]["cluster"]
    assert pools["prefill_policy"] == {"name": "chunked", "chunk_size": 2048}
    assert pools["decode_policy"] == {"name": "decode_first"}


def test_prefix_tier_metrics_reach_wandb_as_kv_hierarchy(tmp_path):
    from policies.chunked import Chunked
    from policylab.analysis.results import write_results
    from policylab.core.config import EngineConfig, ModelConfig
    from policylab.core.engine import Engine
    from policylab.dataplane.sim import SimDataPlane
    from policylab.testing.kv_traces import mooncake_style
    from policylab.testing.replay import SCENARIO_HARDWARE
    trace = list(mooncake_style(60, seed=3, rate=60.0))
    plane = SimDataPlane(ModelConfig(), SCENARIO_HARDWARE, DataplaneConfig(kind="sim"), 0)
    cfg = EngineConfig(block_size=8, num_blocks=90, max_num_batched_tokens=128, max_num_seqs=8,
                       prefix_host_blocks=20, prefix_disk_blocks=60)
    run_dir = tmp_path / "run"
    write_results(run_dir, Engine(trace, Chunked(chunk_size=64), plane, cfg, prefix_block_tokens=32).run(),
                  ResultSettings(config={"seed": 0, "policy": {"name": "chunked"}, "trace": {"name": "fixture"}}))
    summary = json.loads((run_dir / "summary.json").read_text())
    tracker = open_tracker(tracker_settings(run_cfg({})), run_dir)
    tracker.log_run(run_dir, summary)
    tracker.finish()
    (wandb_file,) = Path(json.loads((run_dir / RUN_INFO_FILE).read_text())["dir"]).glob("run-*.wandb")
    log = logged(wandb_file)["summary"]
    tiers = summary["kv_hierarchy"]
    assert tiers["host_hit_blocks"] > 0
    for key in ("host_hit_rate", "disk_hit_rate", "device_hit_rate", "host_bytes", "disk_transfer_time"):
        assert log[f"kv_hierarchy/{key}"] == pytest.approx(tiers[key]), key
