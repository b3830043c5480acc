"""Fault injection, signals: in sweeps (every running job writes its partial results, no job
starts after the stop, no worker outlives the parent, the report prints), two sweeps into one
directory, signals after the replay (plots, W&B) and while the program starts, and a policy that
swallows the stop. Each runs the CLI as a subprocess, with bounded waits."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
BASE = ["trace=poisson", "dataplane=sim", "logger=none", "progress=false"]


class Slow:
    """prefill_first that sleeps each step and touches `marker` once it runs (the test may signal)."""

    def __init__(self, name="slow", sleep: float = 0.02, marker: str = "", watermark: float = 0.01):
        from policies.prefill_first import PrefillFirst      # (its config is prefill_first's)
        self.name, self.inner, self.sleep, self.marker = name, PrefillFirst(watermark=watermark), sleep, marker

    def schedule(self, view):
        if self.marker and view.step == 0:
            Path(self.marker).with_name(f"{Path(self.marker).name}.{os.getpid()}").touch()
        time.sleep(self.sleep)
        return self.inner.schedule(view)

    def on_finished(self, view):
        pass


class Swallowing(Slow):
    """A policy whose schedule() never returns once step 5 is reached, whatever is raised in it."""

    def schedule(self, view):
        if view.step == 5:
            Path(self.marker).touch()
            while True:
                try:
                    time.sleep(0.01)
                except BaseException:     # noqa: B036 (the point: it swallows even KeyboardInterrupt)
                    pass
        return self.inner.schedule(view)


def start(tmp_path: Path, *overrides, group: bool = False, env: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")]),
           **(env or {})}
    base = [b for b in BASE if b.split("=")[0] not in {o.split("=")[0] for o in overrides}]   # (theirs win)
    return subprocess.Popen([sys.executable, "-m", "policylab", "run", *overrides, *base], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=group)


def wait_for(predicate, proc: subprocess.Popen, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert predicate(), proc.communicate(timeout=60)[1][-3000:] if proc.poll() is not None else "timed out"


def finish(proc: subprocess.Popen, limit: float = 120.0) -> str:
    try:
        return proc.communicate(timeout=limit)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL) if os.getpgid(proc.pid) == proc.pid else proc.kill()


def children_of(pid: int) -> list:
    """Live processes whose parent is `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            pass
    return found


def alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ---------------------------------------------------------------- joblib sweeps
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("how", ["SIGTERM to the parent", "Ctrl-C to the group", "SIGTERM to the group"])
def test_a_stop_signal_reaches_every_job_of_a_joblib_sweep(tmp_path, how):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="needs hydra-joblib-launcher")
    marker, sweep = tmp_path / "started", tmp_path / "sweep"
    proc = start(tmp_path, "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "plots=false",
                 f"policy._target_={__name__}.Slow", "policy.name=slow", f"+policy.marker={marker}",
                 "seed=0,1,2,3", f"hydra.sweep.dir={sweep}", group=True)
    try:
        wait_for(lambda: len(list(tmp_path.glob("started.*"))) == 2, proc, 240)   # both workers replaying
        workers = children_of(proc.pid)
        sig = signal.SIGINT if how.startswith("Ctrl-C") else signal.SIGTERM
        (os.killpg if how.endswith("group") else os.kill)(proc.pid, sig)
        err = finish(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert "Traceback" not in err and "4 jobs, 0 complete, 4 did not complete" in err, err[-3000:]
    assert f"sweep stopped by {sig.name}" in err
    jobs = sorted(d for d in sweep.iterdir() if d.is_dir())
    ran = [d for d in jobs if (d / "summary.json").exists()]
    assert len(ran) == 2                                     # the two running jobs wrote their results
    for d in ran:
        summary = json.loads((d / "summary.json").read_text())
        assert summary["status"] == "partial" and summary["counts"]["unfinished"] > 0
        assert summary["error"].startswith("interrupted")
    for d in set(jobs) - set(ran):                           # the others never started
        assert "not run: the sweep was stopped" in (d / "error.txt").read_text()
    deadline = time.monotonic() + 30
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in workers if alive(p)]              # no worker outlives the parent


@pytest.mark.slow
def test_a_stop_signal_to_a_basic_sweep_ends_its_job_and_starts_no_other(tmp_path):
    marker, sweep = tmp_path / "started", tmp_path / "sweep"
    proc = start(tmp_path, "-m", "plots=false", f"policy._target_={__name__}.Slow", "policy.name=slow",
                 f"+policy.marker={marker}", "seed=0,1,2", f"hydra.sweep.dir={sweep}")
    try:
        wait_for(lambda: any(tmp_path.glob("started.*")), proc, 240)
        proc.send_signal(signal.SIGTERM)
        err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and "3 jobs, 0 complete, 3 did not complete" in err, err[-3000:]
    assert "0_slow_poisson [" in err and "]: partial: interrupted (SIGTERM)" in err
    for job in ("1_slow_poisson", "2_slow_poisson"):
        assert "not run: the sweep was stopped (SIGTERM)" in (sweep / job / "error.txt").read_text()


@pytest.mark.slow
def test_a_joblib_sweep_that_completes_leaves_no_worker_behind(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="needs hydra-joblib-launcher")
    marker = tmp_path / "started"
    proc = start(tmp_path, "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "plots=false",
                 "trace.max_requests=20", f"policy._target_={__name__}.Slow", "policy.name=slow",
                 "+policy.sleep=0.0", f"+policy.marker={marker}", "seed=0,1", f"hydra.sweep.dir={tmp_path / 's'}",
                 group=True)
    wait_for(lambda: len(list(tmp_path.glob("started.*"))) >= 1, proc, 240)
    workers = [int(p.name.split(".")[-1]) for p in tmp_path.glob("started.*")]
    err = finish(proc, 240)
    assert proc.returncode == 0, err[-3000:]
    time.sleep(1)
    assert not [p for p in workers if alive(p)]


@pytest.mark.slow
def test_two_sweeps_into_one_directory_refuse_the_second(tmp_path):
    marker, sweep = tmp_path / "started", tmp_path / "sweep"
    first = start(tmp_path, "-m", "plots=false", f"policy._target_={__name__}.Slow", "policy.name=slow",
                  f"+policy.marker={marker}", "seed=0,1", f"hydra.sweep.dir={sweep}", group=True)
    try:
        wait_for(lambda: any(tmp_path.glob("started.*")), first, 240)
        second = start(tmp_path, "-m", "plots=false", "trace.max_requests=10", "policy=chunked", "seed=5,6",
                       f"hydra.sweep.dir={sweep}")
        err = finish(second)
        assert second.returncode == 2 and f"another sweep (process {first.pid}) is writing into {sweep}" in err
        first.send_signal(signal.SIGTERM)
        finish(first)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert not list(sweep.glob("*chunked*")) and not list(sweep.rglob("*.previous.*"))


# ------------------------------------------------------- after the replay
SLOW_AFTER_THE_REPLAY = """
import json, os, pathlib, time
import policylab.analysis.plots as plots
import policylab.analysis.tracking as tracking

def slow(*args, **kwargs):                      # plots that take long: the test signals meanwhile
    pathlib.Path(os.environ["POLICYLAB_TEST_MARK"]).touch()
    time.sleep(120)

finish = tracking.WandbTracker.finish

def recorded_finish(self, exit_code=None):      # what the W&B run is finished with
    finish(self, exit_code)
    pathlib.Path(os.environ["POLICYLAB_TEST_MARK"] + ".exit").write_text(json.dumps(exit_code))

plots.write_run_plots = slow
tracking.WandbTracker._log = lambda self, run_dir, summary: slow()
tracking.WandbTracker.finish = recorded_finish
"""


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["plots", "W&B"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_after_the_replay_says_the_results_are_complete(tmp_path, sig, phase):
    (tmp_path / "patch").mkdir()
    (tmp_path / "patch" / "sitecustomize.py").write_text(SLOW_AFTER_THE_REPLAY)
    run_dir, mark = tmp_path / "run", tmp_path / "slow"
    overrides = ["plots=true"] if phase == "plots" else \
        ["plots=false", "logger=wandb", "logger.mode=offline", f"logger.dir={tmp_path / 'wandb'}"]
    proc = start(tmp_path, "policy=prefill_first", "trace.max_requests=50", *overrides, f"hydra.run.dir={run_dir}",
                 env={"POLICYLAB_TEST_MARK": str(mark), "WANDB_SILENT": "true",
                      "PYTHONPATH": os.pathsep.join([str(tmp_path / "patch"), str(TESTS), str(ROOT)])})
    try:
        wait_for(mark.exists, proc)
        proc.send_signal(sig)
        err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err[-2000:]
    doing = "drawing the plots" if phase == "plots" else "logging to W&B"
    assert f"stopped by {sig.name} while {doing}: the results in {run_dir} are complete" in err, err[-2000:]
    assert "before any results were written" not in err and "Traceback" not in err
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "complete"
    assert not (run_dir / "error.txt").exists()
    if phase == "W&B":                                 # finished, with the job's own exit code
        assert json.loads(Path(f"{mark}.exit").read_text()) == 128 + sig


HOLD_THE_IMPORTS = """
import os, pathlib, sys, time

class HoldTheCli:              # the program is held inside its imports until the test's signal is noted
    def find_spec(self, name, path=None, target=None):
        if name == "policylab.apps.cli":
            from policylab import _startup
            pathlib.Path(os.environ["POLICYLAB_TEST_MARK"]).touch()
            deadline = time.monotonic() + 60
            while not _startup.received and time.monotonic() < deadline:
                time.sleep(0.01)
        return None

sys.meta_path.insert(0, HoldTheCli())
"""


def test_ctrl_c_while_the_program_starts_is_one_line(tmp_path):
    (tmp_path / "patch").mkdir()
    (tmp_path / "patch" / "sitecustomize.py").write_text(HOLD_THE_IMPORTS)
    mark = tmp_path / "importing"
    proc = start(tmp_path, "policy=prefill_first", f"hydra.run.dir={tmp_path / 'run'}",
                 env={"POLICYLAB_TEST_MARK": str(mark),
                      "PYTHONPATH": os.pathsep.join([str(tmp_path / "patch"), str(TESTS), str(ROOT)])})
    wait_for(mark.exists, proc)                       # inside the imports, whatever this machine's speed
    proc.send_signal(signal.SIGINT)
    err = finish(proc)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert len([line for line in err.splitlines() if "INFO" not in line]) == 1, err
    assert "stopped (SIGINT)" in err


# ---------------------------------------------------- a policy that swallows
@pytest.mark.timeout(300)
@pytest.mark.parametrize("signals", [("SIGINT", "SIGINT"), ("SIGTERM", "SIGHUP"), ("SIGTERM",)],
                         ids=["INT-INT", "TERM-HUP", "TERM then the deadline"])
@pytest.mark.slow
def test_a_policy_that_swallows_the_stop_still_gets_its_results_written(tmp_path, signals):
    marker, run_dir = tmp_path / "stuck", tmp_path / "run"
    proc = start(tmp_path, "plots=false", f"policy._target_={__name__}.Swallowing", "policy.name=swallow",
                 f"+policy.marker={marker}", f"hydra.run.dir={run_dir}")
    try:
        wait_for(marker.exists, proc)
        for name in signals:
            proc.send_signal(getattr(signal, name))
            time.sleep(1.5)                          # (a second signal counts from 1 s after the first)
        err = finish(proc, 120)
    finally:
        if proc.poll() is None:
            proc.kill()
    first = getattr(signal, signals[0])
    assert proc.returncode == 128 + first, err[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "partial" and summary["counts"]["requests"] == 300
    assert summary["error"].startswith(f"interrupted ({first.name if first != signal.SIGINT else 'SIGINT'})")
    assert "the policy did not return from schedule()" in err
    assert not list(run_dir.glob(".*tmp"))
