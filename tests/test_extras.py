"""The sweep and ray extras, for real: a 3-trial Optuna study, a submitit-local sweep and a Ray
sweep on a local Ray instance bound to loopback, each with its results read back.

These run only in the extras' own environment (`.ci/run`, block `extras`: POLICYLAB_EXTRAS=1 and
`pip install -e '.[dev,sweep,ray]'`); elsewhere they skip, saying so."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ("hydra_plugins.hydra_optuna_sweeper", "hydra_plugins.hydra_submitit_launcher",
           "hydra_plugins.hydra_ray_launcher")
_missing = [m for m in PLUGINS if importlib.util.find_spec("hydra_plugins") is None
            or importlib.util.find_spec(m) is None]
pytestmark = [
    pytest.mark.extras,
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.environ.get("POLICYLAB_EXTRAS") != "1",
                       reason="runs in the extras venv only (.ci/run block `extras`, POLICYLAB_EXTRAS=1)"),
    pytest.mark.skipif(bool(_missing), reason=f"needs the sweep and ray extras ({', '.join(_missing)} missing)"),
]
QUICK = ["dataplane=sim", "logger=none", "plots=false", "progress=false", "trace.max_requests=40"]


def policylab(*args, timeout=240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HYDRA_FULL_ERROR": "1"}
    done = subprocess.run([sys.executable, "-m", "policylab", *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def summaries(sweep: Path) -> dict:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(sweep.glob("*/summary.json"))}


def test_optuna_study_of_three_trials_runs_and_saves_the_best(tmp_path):
    sweep = tmp_path / "optuna"
    policylab("run", "-m", "+experiment=optuna_chunk_size", "hydra.sweeper.n_trials=3",
              "hydra.sweeper.sampler.n_startup_trials=3", "trace.repeat=1", f"hydra.sweep.dir={sweep}")
    runs = summaries(sweep)
    assert len(runs) == 3 and all(s["status"] == "complete" for s in runs.values())
    chunks = [s["config"]["policy"]["chunk_size"] for s in runs.values()]
    assert all(32 <= c <= 2048 for c in chunks)
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    by_chunk = {s["config"]["policy"]["chunk_size"]: s["e2e"]["mean"] for s in runs.values()}
    assert best["best_params"]["policy.chunk_size"] == min(by_chunk, key=by_chunk.get)
    assert best["best_value"] == pytest.approx(min(by_chunk.values()))


def test_submitit_local_sweep_runs_each_job_in_its_own_process(tmp_path):
    sweep = tmp_path / "submitit"
    policylab("run", "-m", "hydra/launcher=submitit_local", "policy=chunked,prefill_first", *QUICK,
              f"hydra.sweep.dir={sweep}")
    runs = summaries(sweep)
    assert sorted(s["policy"] for s in runs.values()) == ["chunked", "prefill_first"]
    assert all(s["counts"]["finished"] == 40 for s in runs.values())
    assert list(sweep.glob(".submitit/*/*_log.out"))          # submitit ran them as jobs
    compared = policylab("compare", str(sweep), "-o", str(tmp_path / "cmp"))
    assert "chunked" in compared.stdout and (tmp_path / "cmp" / "compare.csv").is_file()


def test_ray_sweep_on_a_local_loopback_instance(tmp_path):
    sweep = tmp_path / "ray"
    policylab("run", "-m", "hydra/launcher=ray", "+hydra.launcher.ray.init._node_ip_address=127.0.0.1",
              "+hydra.launcher.ray.init.include_dashboard=false", "+hydra.launcher.ray.init.num_cpus=2",
              "policy=chunked,prefill_first", *QUICK, f"hydra.sweep.dir={sweep}")
    runs = summaries(sweep)
    assert sorted(s["policy"] for s in runs.values()) == ["chunked", "prefill_first"]
    assert all(s["counts"]["finished"] == 40 and s["status"] == "complete" for s in runs.values())
