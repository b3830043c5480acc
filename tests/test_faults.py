"""Fault injection, part 1: nothing is lost.

Signals need a real process, so those tests run the CLI as a subprocess; everything else runs
in-process. In every test each trace request is in requests.parquet (finished, rejected with a
reason, or unfinished in a run marked partial), unless the run was refused before it started.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from policylab.analysis.results import ResultsWriteError, write_results
from policylab.apps.capacity import PolicyFailed, find_capacity
from policylab.apps.cli import CONFIG_DIR, main
from policylab.apps.config import typed_config
from policylab.apps.jobs import build_engine, replay
from policylab.apps.run import run
from policylab.apps.settings import result_settings

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent


class ExplodeAt:
    """prefill_first that raises (or exits, or sleeps) on cue: the policy of these tests."""

    def __init__(self, name="explode_at", explode_at: int = 10**9, how: str = "raise",
                 sleep: float = 0.0, marker: str = "", watermark: float = 0.01):   # (prefill_first's config)
        from policies.prefill_first import PrefillFirst
        if not isinstance(explode_at, int):
            raise ValueError(f"explode_at must be an int, got {explode_at!r}")
        self.name, self.inner, self.explode_at, self.how = name, PrefillFirst(watermark=watermark), explode_at, how
        self.sleep, self.marker = sleep, marker

    def schedule(self, view):
        if self.marker and view.step == 0:
            Path(self.marker).touch()            # the replay is under way: the test may signal now
        if self.sleep:
            time.sleep(self.sleep)
        if view.step == self.explode_at:
            if self.how == "exit":
                sys.exit(3)
            if self.how == "base":
                raise GeneratorExit("a BaseException that is not an Exception")
            raise RuntimeError(f"exploded at step {self.explode_at}")
        return self.inner.schedule(view)

    def on_finished(self, view):
        pass


def config(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=["trace=poisson", "dataplane=sim", "logger=none", "progress=false",
                                            "plots=false", *overrides])


def assert_every_request_kept(run_dir: Path, n: int, status: str) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    requests = pd.read_parquet(run_dir / "requests.parquet")
    assert summary["status"] == status and len(requests) == n
    assert set(requests["status"]) <= {"finished", "rejected", "unfinished"}
    assert requests.loc[requests["status"] == "rejected", "reason"].str.len().gt(0).all()
    return summary


# ------------------------------------------------------------------ 1. signals
def cli_process(tmp_path: Path, *overrides) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "policylab", "run", *overrides, "trace=poisson", "dataplane=sim", "logger=none",
           "progress=false", "plots=false", f"hydra.run.dir={tmp_path / 'run'}"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("signals", [(signal.SIGTERM,), (signal.SIGHUP,), (signal.SIGINT, signal.SIGINT)],
                         ids=["SIGTERM", "SIGHUP", "second-SIGINT"])
def test_a_stop_signal_keeps_every_request_marked_partial(tmp_path, signals):
    marker = tmp_path / "started"
    proc = cli_process(tmp_path, "policy=prefill_first", f"policy._target_={__name__}.ExplodeAt",
                       "+policy.sleep=0.01", f"+policy.marker={marker}")
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not marker.exists():
            proc.kill()
            assert False, proc.communicate(timeout=60)[1][-2000:]
        for sig in signals:                 # a second Ctrl-C lands while the results are written
            proc.send_signal(sig)
            time.sleep(0.02)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signals[0], err[-2000:]
    summary = assert_every_request_kept(tmp_path / "run", 300, "partial")
    assert summary["error"] == f"interrupted ({'Ctrl-C' if signals[0] == signal.SIGINT else signals[0].name})"
    assert summary["counts"]["unfinished"] > 0 and "Traceback" not in err


@pytest.mark.parametrize("how", ["exit", "base"])
def test_sys_exit_or_any_base_exception_in_a_policy_keeps_the_results(tmp_path, how):
    summary = run(config(f"policy._target_={__name__}.ExplodeAt", "policy.name=x", "+policy.explode_at=20",
                         f"+policy.how={how}"), tmp_path)
    assert summary["error"].startswith("SystemExit: 3" if how == "exit" else "GeneratorExit")
    assert_every_request_kept(tmp_path, 300, "partial")


# ------------------------------------------------------------ 2. output dirs
def test_run_and_sweep_directories_carry_the_process_id():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["policy=chunked", "trace=poisson"], return_hydra_config=True)
    run_dir, sweep_dir = OmegaConf.select(cfg, "hydra.run.dir"), OmegaConf.select(cfg, "hydra.sweep.dir")
    assert f"-{os.getpid()}_chunked_poisson" in run_dir and sweep_dir.endswith(f"-{os.getpid()}")


# ------------------------------------------------------------------ 3. sweeps
def test_a_basic_sweep_runs_every_job_and_reports_the_failed_ones(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    with pytest.raises(SystemExit) as stop:
        main(["run", "-m", "trace=poisson", "dataplane=sim", "logger=none", "progress=false", "plots=false",
              "trace.max_requests=40", f"policy._target_={__name__}.ExplodeAt", "policy.name=x",
              "+policy.explode_at=abc,5,100000", f"hydra.sweep.dir={sweep}"])
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert "3 jobs, 1 complete, 2 did not complete" in err
    assert "explode_at=abc]: failed: cannot build policy" in err and "explode_at=5]: partial: RuntimeError" in err
    assert (sweep / "0_x_poisson" / "error.txt").is_file()
    assert_every_request_kept(sweep / "1_x_poisson", 40, "partial")
    assert_every_request_kept(sweep / "2_x_poisson", 40, "complete")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_joblib_sweep_runs_every_job_and_reports_the_failed_ones(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="needs hydra-joblib-launcher")
    proc = cli_process(tmp_path, "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "trace.max_requests=40",
                       f"policy._target_={__name__}.ExplodeAt", "policy.name=x", "+policy.explode_at=abc,5,100000",
                       f"hydra.sweep.dir={tmp_path / 'sweep'}")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    assert "3 jobs, 1 complete, 2 did not complete" in err
    assert_every_request_kept(tmp_path / "sweep" / "1_x_poisson", 40, "partial")
    assert_every_request_kept(tmp_path / "sweep" / "2_x_poisson", 40, "complete")


# --------------------------------------------------------------- 4. disk full
def test_a_full_disk_still_writes_the_summary_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    cfg = typed_config(config("policy=prefill_first", "trace.max_requests=30"))
    result = replay(build_engine(cfg), progress=False)

    real_fsync, calls = os.fsync, []

    def fsync_fails_once(fd):          # the disk fills while requests.parquet is written
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync_fails_once)
    with pytest.raises(ResultsWriteError, match=r"requests.parquet: No space left on device"):
        write_results(tmp_path, result, result_settings(cfg))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["missing_files"] == ["requests.parquet"] and summary["counts"]["finished"] == 30
    assert (tmp_path / "steps.parquet").is_file() and not list(tmp_path.glob(".*tmp"))


@pytest.mark.slow
def test_a_really_full_filesystem_keeps_the_summary(tmpfs):
    """The same on a 64 KiB tmpfs, where the machine lets the test mount one (root, Linux)."""
    tiny = tmpfs("64k")
    cfg = typed_config(config("policy=prefill_first"))
    result = replay(build_engine(cfg), progress=False)
    with pytest.raises(ResultsWriteError, match="No space left on device"):
        write_results(tiny / "run", result, result_settings(cfg))
    summary = json.loads((tiny / "run" / "summary.json").read_text())
    assert summary["counts"]["requests"] == 300 and "requests.parquet" in summary["missing_files"]
    assert not list((tiny / "run").glob(".*tmp"))


# ------------------------------------------------------ 5. re-run into a dir
def test_a_failed_rerun_never_leaves_the_old_complete_summary(tmp_path, capsys):
    args = ["run", "trace=poisson", "dataplane=sim", "logger=none", "progress=false", "plots=false",
            "trace.max_requests=20", f"hydra.run.dir={tmp_path}"]
    main(args)
    with pytest.raises(SystemExit):
        main(args + ["policy=chunked", "policy.chunk_size=abc"])
    assert not (tmp_path / "summary.json").exists() and not (tmp_path / "requests.parquet").exists()
    assert json.loads((tmp_path / "summary.previous.json").read_text())["status"] == "complete"
    assert "cannot build policy" in (tmp_path / "error.txt").read_text()


# ------------------------------------------------------ 6. overflowing numbers
def test_a_prompt_of_1e24_tokens_is_refused_naming_file_line_and_field(tmp_path, capsys):
    trace = tmp_path / "huge.jsonl"
    trace.write_text('{"arrival_time": 0, "prompt_tokens": 5, "output_tokens": 5}\n'
                     '{"arrival_time": 1, "prompt_tokens": 1000000000000000000000000, "output_tokens": 5}\n')
    with pytest.raises(SystemExit):
        main(["run", "trace=file", f"trace.path={trace}", "dataplane=sim", "logger=none",
              f"hydra.run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert "huge.jsonl:2: field 'prompt_tokens': expected a positive integer up to 1e+12" in err
    assert "Traceback" not in err


# --------------------------------------------------- 14, 15. failing policies
def test_a_policys_traceback_is_written_to_a_file_named_in_the_message(tmp_path, capsys):
    summary = run(config(f"policy._target_={__name__}.ExplodeAt", "policy.name=x", "+policy.explode_at=30"),
                  tmp_path)
    assert f"(traceback: {tmp_path / 'traceback.txt'})" in summary["error"]
    text = (tmp_path / "traceback.txt").read_text()
    assert "in schedule" in text and "RuntimeError: exploded at step 30" in text
    assert_every_request_kept(tmp_path, 300, "partial")


def test_capacity_with_a_crashing_policy_says_it_failed(tmp_path, capsys):
    cfg = config(f"policy._target_={__name__}.ExplodeAt", "policy.name=x", "+policy.explode_at=30",
                 "trace.max_requests=50")
    with pytest.raises(PolicyFailed, match=r"policy x failed at rate_scale 0.5: RuntimeError: exploded"):
        find_capacity(cfg, typed_config(cfg).capacity, tmp_path)
    report = json.loads((tmp_path / "capacity.json").read_text())
    assert report["status"] == "failed" and report["partial"] is True and "exploded" in report["error"]
    assert (tmp_path / "traceback.txt").is_file()
