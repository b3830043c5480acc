"""Hydra sweeps: a joblib multirun of real runs, then `compare` over its directory."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

from policylab.apps.cli import CONFIG_DIR
from policylab.analysis.compare import main as compare_main
from policylab.analysis.run_table import collect_runs, find_run_dirs

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_joblib_multirun_writes_every_run_then_compares(tmp_path, capsys):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="needs hydra-joblib-launcher")
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "policylab", "run", "-m", "policy=prefill_first", "trace=poisson",
           "dataplane=sim", "logger=none", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
           "trace.max_requests=30", "seed=0,1", "progress=false", f"hydra.sweep.dir={sweep}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Joblib.Parallel(n_jobs=2" in done.stdout + done.stderr     # the joblib launcher ran them
    assert "┏" not in done.stdout and done.stdout.count("SLO attainment") == 2   # one line per job, no tables
    runs = find_run_dirs([sweep])
    assert [d.name for d in runs] == ["0_prefill_first_poisson", "1_prefill_first_poisson"]
    for seed, run_dir in enumerate(runs):
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "complete" and summary["counts"]["requests"] == 30
        assert summary["config"]["seed"] == seed
        assert f"seed={seed}" in yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    df, common = collect_runs(runs)
    assert list(df["replicate"]) == ["seed=0 replicate=0", "seed=1 replicate=0"] and "policy=prefill_first" in common
    assert list(df["params"]) == ["", ""]                      # seeds are replicates, not configurations
    assert compare_main([str(sweep)]) == 0
    assert (sweep / "compare" / "compare.md").is_file()
    assert "its 2 replicates gave identical results" in capsys.readouterr().err    # the seed alone varies nothing


def test_optuna_chunk_size_experiment_composes():
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="needs the `sweep` extra (Optuna)")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=optuna_chunk_size"], return_hydra_config=True)
    assert cfg.hydra.sweeper.direction == "minimize" and "policy.chunk_size" in cfg.hydra.sweeper.params
    assert cfg.objective == "e2e.mean" and cfg.trace.rate_scale == 8
    assert cfg.policy.name == "chunked" and cfg.dataplane.kind == "sim"


def test_slurm_launcher_preset_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs the `sweep` extra")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher") and cfg.hydra.launcher.timeout_min > 0


def test_objective_is_any_numeric_summary_key(capsys):
    from policylab.apps.run import objective_value
    summary = {"goodput": 3.5, "ttft": {"p99": 0.25, "p99.9": 0.5}, "slo_attainment": None,
               "status": "complete", "config": {"seed": 0}}
    assert objective_value(summary, "goodput") == 3.5
    assert objective_value(summary, "ttft.p99") == objective_value(summary, "ttft/p99") == 0.25
    assert objective_value(summary, "ttft.p99.9") == 0.5
    assert objective_value(summary, "slo_attainment") != objective_value(summary, "slo_attainment")   # NaN
    with pytest.raises(SystemExit):
        objective_value(summary, "status")
    assert "objective=status: not a numeric summary key; one of goodput, ttft.p99" in capsys.readouterr().err
