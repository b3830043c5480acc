"""Faults and bad input on the newer levers: a disk prefix tier on a full disk, a run stopped
while a request's samples still run, and absurd sizes, times and link speeds refused by
arithmetic before the run, each naming its key (docs/faults.md)."""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import policylab.apps.config_checks as config_checks
from policies.chunked import Chunked
from policylab.analysis.results import summarize_run
from policylab.apps.cli import main
from policylab.core.config import EngineConfig
from policylab.core.engine import Engine
from policylab.core.request import Status, TraceRequest
from policylab.testing.harness import _dataplane

ROOT = Path(__file__).resolve().parent.parent
BASE = ["run", "dataplane=sim", "logger=none", "progress=false", "plots=false"]
DISK_TIER = ["dataplane=torch", "model=tiny", "trace=poisson", "trace.max_requests=30", "trace.rate_scale=10",
             "engine.num_blocks=40", "engine.prefix_host_blocks=10", "engine.prefix_disk_blocks=20000"]


# ------------------------------------------------------------------ a disk tier on a full disk
@pytest.mark.timeout(240)
def test_a_disk_tier_larger_than_its_disk_is_refused_before_the_run(tmpfs, tmp_path):
    """The tier's memory-mapped file (20,000 blocks) cannot be backed by a 100 KB disk: a write into
    it was a SIGBUS that killed the run with no message and no results."""
    run_dir, disk = tmp_path / "run", tmpfs("100k")
    done = subprocess.run([sys.executable, "-m", "policylab", *BASE, *DISK_TIER, f"engine.prefix_disk_path={disk}",
                           f"hydra.run.dir={run_dir}"], cwd=ROOT, capture_output=True, text=True, timeout=200)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert f"engine.prefix_disk_blocks=20,000 (engine.prefix_disk_path={disk}): its file needs" in done.stderr
    assert "100.0 KiB free" in done.stderr and "Traceback" not in done.stderr
    assert "prefix_disk_blocks" in (run_dir / "error.txt").read_text() and not list(disk.iterdir())


@pytest.mark.timeout(240)
def test_a_disk_that_fills_before_the_tier_file_is_made_ends_the_run_partial_with_its_results(tmp_path, monkeypatch):
    """The disk had room at the start, then not when the file is made: the reservation fails as an
    ordinary error, the run ends partial and every request is written."""
    def no_room(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", no_room)
    disk = tmp_path / "disk"
    disk.mkdir()
    with pytest.raises(SystemExit):
        main([*BASE, *DISK_TIER, f"engine.prefix_disk_path={disk}", f"hydra.run.dir={tmp_path / 'run'}"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "partial" and summary["counts"]["requests"] == 30
    assert "engine.prefix_disk_blocks=20,000" in summary["error"] and "could not reserve" in summary["error"]
    assert len(pd.read_parquet(tmp_path / "run" / "requests.parquet")) == 30 and not list(disk.iterdir())


# ------------------------------------------------------------------ samples of a stopped run
class StopsAtStep(Chunked):
    """Chunked until step `stop`, then raises (a run that ends partial there)."""

    def __init__(self, stop: int):
        super().__init__(chunk_size=64)
        self.stop = stop

    def schedule(self, view):
        if view.step >= self.stop:
            raise RuntimeError("stopped for the test")
        return super().schedule(view)


@pytest.mark.timeout(60)
def test_a_stopped_run_leaves_a_request_with_samples_to_go_unfinished_with_the_samples_done():
    """Sample 0 generates 3 tokens, its 3 forks 40 each: at step 10 the request's own stream has
    finished, its forks have not, so the request is unfinished (it was `finished`, with an e2e)."""
    cfg = EngineConfig(block_size=8, num_blocks=200, max_num_batched_tokens=256, max_num_seqs=16, max_model_len=512)
    trace = [TraceRequest(0.0, 30, 3, n=4, fork_output_tokens=(40, 40, 40)), TraceRequest(0.0, 20, 2)]
    result = Engine(trace, StopsAtStep(10), _dataplane(0), cfg).run()
    parent = result.requests[0]
    assert result.status == "partial" and len(parent.output_ids) == 3
    assert all(f.status is Status.RUNNING for f in parent.forks)
    requests, _, summary = summarize_run(result)
    row = requests.set_index("req_id").loc[0]
    assert row["status"] == "unfinished" and row["reason"] == "1 of 4 samples finished when the run stopped"
    assert pd.isna(row["e2e"]) and requests.set_index("req_id").loc[1, "status"] == "finished"
    assert summary["counts"]["finished"] == 1 and summary["counts"]["unfinished"] == 1


@pytest.mark.timeout(120)
def test_a_request_with_many_samples_ends_with_its_last_one(tmp_path):
    """Done samples are counted, not rescanned: 2 requests of 3,000 samples each complete."""
    main([*BASE, "trace=poisson", "trace.max_requests=2", "trace.max_output_tokens=4", "engine.parallel_samples=3000",
          f"hydra.run.dir={tmp_path}"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["counts"]["finished"] == 2
    assert summary["forks"]["finished_forks"] == 2 * 2999


# ------------------------------------------------------------------ absurd settings
GiB = 2 ** 30
REFUSED = {
    "samples": (["trace=poisson", "engine.parallel_samples=100000"],
                "engine.parallel_samples=100,000: at most 10,000 samples or beams per request"),
    "beams": (["trace=poisson", "engine.beam_width=100000"], "engine.beam_width=100,000: at most 10,000"),
    "beams past the seqs": (["trace=poisson", "engine.beam_width=200"],
                            "engine.beam_width=200 exceeds engine.max_num_seqs=128: a request's beams decode together"),
    "replicas": (["trace=poisson", "cluster.replicas=100000"],     # (27,286 blocks: the sim's llama3-8b on an H100 in vLLM)
                 "cluster.replicas=100,000 of 27,286 KV blocks each: its accounting alone needs ", "GiB, this "
                 "machine has 16 GiB"),
    "host tier": (["trace=poisson", "engine.prefix_host_blocks=1000000000000"],
                  "engine.prefix_host_blocks=1,000,000,000,000: its accounting alone needs 59,604.6 GiB"),
    "swap bandwidth": (["trace=poisson", "engine.swap_bandwidth=1e-3"],
                       "engine.swap_bandwidth=0.001 bytes/s: no real link has it"),
    "cluster link": (["trace=poisson", "cluster.replicas=2", "cluster.link.bandwidth=1e20"],
                     "cluster.link.bandwidth=1e+20 bytes/s: no real link has it"),
    "tp link": (["trace=poisson", "hardware.link_bandwidth=10"], "hardware.link_bandwidth=10 bytes/s: no real link"),
    "swap latency": (["trace=poisson", "engine.swap_latency=1e12"],
                     "engine.swap_latency=1e+12: a time in seconds must be finite, >= 0 and at most 1e+09 s"),
    "link latency": (["trace=poisson", "cluster.replicas=2", "cluster.link.latency=1e10"],
                     "cluster.link.latency=1e+10: a time in seconds"),
    "window": (["trace=poisson", "trace.end_time=1e15"], "trace.end_time=1e+15: a time in seconds"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_an_absurd_setting_is_refused_before_the_run_naming_its_key(tmp_path, capsys, monkeypatch, case):
    monkeypatch.setattr(config_checks, "physical_memory", lambda: 16 * GiB)     # (the same on every machine)
    overrides, *messages = REFUSED[case]
    with pytest.raises(SystemExit) as stop:
        main([*BASE, "trace.max_requests=20", *overrides, f"hydra.run.dir={tmp_path}"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and all(m in err for m in messages) and "Traceback" not in err, err[-2000:]
    assert not (tmp_path / "summary.json").exists()


def write_lines(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


TRACE_REFUSED = {
    "samples": ([{"arrival_time": 0, "prompt_tokens": 9, "output_tokens": 3, "n": 100000}],
                ":1: field 'n': expected at most 10,000 (samples or beams of one request), got 100,000"),
    "think time": ([{"session": "s", "turn": 0, "arrival_time": 0, "new_tokens": 9, "output_tokens": 3},
                    {"session": "s", "turn": 1, "think_time": 1e12, "new_tokens": 9, "output_tokens": 3}],
                   ":2: field 'think_time': expected a finite number of seconds >= 0 (at most 1e+09), got 1000000000000.0"),
    "think times together": ([{"session": "s", "turn": 0, "arrival_time": 0, "new_tokens": 9, "output_tokens": 3}]
                             + [{"session": "s", "turn": k, "think_time": 4e8, "new_tokens": 9, "output_tokens": 3}
                                for k in (1, 2, 3)],
                             ":4: field 'think_time': session s's think times add up to 1.2e+09 s by turn 3"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(TRACE_REFUSED))
def test_an_absurd_trace_field_is_refused_naming_its_line(tmp_path, capsys, case):
    records, message = TRACE_REFUSED[case]
    trace = write_lines(tmp_path / "t.jsonl", records)
    with pytest.raises(SystemExit) as stop:
        main([*BASE, "trace=file", f"trace.path={trace}", f"hydra.run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and f"{trace}{message}" in err and "Traceback" not in err, err[-2000:]


@pytest.mark.timeout(60)
def test_a_beam_wider_than_the_running_sequences_is_refused_with_the_request(tmp_path, capsys):
    trace = write_lines(tmp_path / "t.jsonl", [{"arrival_time": 0, "prompt_tokens": 9, "output_tokens": 3},
                                                {"arrival_time": 1, "prompt_tokens": 9, "output_tokens": 3,
                                                 "beam_width": 40}])
    with pytest.raises(SystemExit):
        main([*BASE, "trace=file", f"trace.path={trace}", "engine.max_num_seqs=32", f"hydra.run.dir={tmp_path / 'run'}"])
    assert ("trace: request 1 (arrival 1 s) has beam_width=40, beyond engine.max_num_seqs=32"
            in capsys.readouterr().err)


@pytest.mark.timeout(60)
def test_the_memory_of_every_sample_is_worked_out_before_the_run(monkeypatch):
    """50 requests of 10,000 samples: their state and tokens held until the results are written."""
    from policylab.apps.config import typed_config
    from hydra import compose, initialize_config_dir
    from policylab.apps.cli import CONFIG_DIR
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = typed_config(compose("config", overrides=["dataplane=sim", "engine.parallel_samples=10000"]))
    trace = [TraceRequest(float(i), 100, 200) for i in range(50)]
    monkeypatch.setattr(config_checks, "physical_memory", lambda: 2 * GiB)
    with pytest.raises(ValueError, match=r"engine.parallel_samples: 500,000 sequences of 50 requests: its "
                                         r"accounting alone needs 3.3 GiB, this machine has 2 GiB"):
        config_checks.check_workload(cfg, trace)
    monkeypatch.setattr(config_checks, "physical_memory", lambda: 16 * GiB)
    config_checks.check_workload(cfg, trace)
    config_checks.check_workload(dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, parallel_samples=0)),
                                 trace * 1000)
