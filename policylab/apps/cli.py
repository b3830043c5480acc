"""`python -m policylab SUBCOMMAND ...`: Hydra jobs (run, capacity, ...) and plain tools (trace, compare).

Hydra rejects a bare subcommand word before its overrides, so the word is taken off
argv here and the rest handed to the `@hydra.main` function. Each job turns the composed
config into typed dataclasses once (`typed_config`) and passes only those down.
"""
from __future__ import annotations

import functools
import importlib
import math
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from policylab.apps.config import CONFIG_DIR, register, typed_config
from policylab.apps.jobs import check_output_dir_writable, expand_shorthands, fail, guarded_job, in_multirun, \
    write_error_file
from policylab.apps.signals import default_stop_signals, keep_stop_signals, noted_stop, signal_name
from policylab.apps.sweep_control import STOP_MARKER, mark_stopped, stopped_sweep

register()


def hydra_job(job):
    """`@hydra.main` over `job`; in a sweep, a job that fails or ends partial returns NaN instead
    of exiting, so the launcher (basic, joblib, ...) runs every other job, and the sweep report
    (sweep_report.py) names the failed ones at the end. A job stopped by a signal (exit code
    >= 128) marks the sweep stopped: the jobs after it do not start (sweep_control.py)."""
    @functools.wraps(job)
    def sweep_safe(cfg: DictConfig):
        if not in_multirun():
            return job(cfg)
        keep_stop_signals()          # (a worker between jobs: a stop is noted, never fatal)
        sweep_dir, run_dir = Path(HydraConfig.get().sweep.dir), Path(HydraConfig.get().runtime.output_dir)
        stopped = stopped_sweep(sweep_dir)
        if stopped:
            write_error_file(run_dir, f"not run: the sweep was stopped ({stopped}) before this job started")
            return math.nan
        try:
            return job(cfg)
        except SystemExit as e:
            if not isinstance(e.code, int) or e.code == 0:
                raise
            if e.code >= 128:
                mark_stopped(sweep_dir / STOP_MARKER, e.code - 128)
            return math.nan
    return hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")(sweep_safe)


@hydra_job
def run_main(cfg: DictConfig) -> float:
    from policylab.apps.run import objective_value, run
    summary = guarded_job(lambda run_dir: run(cfg, run_dir))
    if summary.get("status") != "complete":
        raise SystemExit(1)
    return objective_value(summary, cfg.objective)     # for Hydra sweepers (Optuna)


@hydra_job
def calibrate_main(cfg: DictConfig) -> None:
    from policylab.apps.calibrate import calibrate
    from policylab.apps.jobs import build_engine, dataplane_of, measuring
    from policylab.apps.offered_load import resolve_load

    def body(run_dir: Path):
        run = resolve_load(typed_config(cfg))[0]
        if run.dataplane.kind == "vllm":
            from policylab.apps.fidelity_vllm import calibrate_vllm
            return calibrate_vllm(run, run_dir)
        run = measuring(run, "calibrate")
        plane = dataplane_of(run)
        return calibrate(plane, run.engine, run_dir, run.seed, build_engine(run, plane))
    guarded_job(body)


@hydra_job
def fidelity_main(cfg: DictConfig) -> None:
    from policylab.apps.fidelity import fidelity
    guarded_job(lambda run_dir: fidelity(cfg, run_dir))


@hydra_job
def generate_main(cfg: DictConfig) -> None:
    from policylab.apps.generate import generate_text

    def body(run_dir: Path) -> None:
        run = typed_config(cfg)
        g = run.generate
        text = generate_text(run.model, run.dataplane, g.prompt, g.max_new_tokens, g.temperature, g.top_k,
                             g.top_p, run.seed, g.chat, run.engine)
        print(f"{g.prompt}\n--- {run.model.name} ---\n{text}")
    guarded_job(body)


@hydra_job
def capacity_main(cfg: DictConfig) -> float:
    from policylab.apps.capacity import capacity_job
    return capacity_job(cfg)


TOOLS = {
    "trace": "policylab.apps.trace_cli",
    "features": "policylab.apps.features_cli",
    "profile": "policylab.apps.data_cli",
    "compare": "policylab.analysis.compare",
    "sim-check": "policylab.apps.sim_check",
    "fidelity-e2e": "policylab.apps.fidelity_e2e",
    "reproduce": "policylab.apps.reproduce.cli",
}
HYDRA_JOBS = {"run": run_main, "calibrate": calibrate_main, "fidelity": fidelity_main,
              "capacity": capacity_main, "generate": generate_main}
USAGE = """usage: python -m policylab COMMAND ...

  run        replay a trace under a policy (Hydra overrides: policy=chunked trace=bursty ...; -m for sweeps)
  trace      inspect, convert, generate or download arrival traces (python -m policylab trace --help)
  profile    download Vidur's published GPU profiles (python -m policylab profile list)
  calibrate  profile the real data plane (a grid of batches + a replay of the trace), fit the sim
  fidelity   replay on the real data plane and on the calibrated sim; report per-metric error
  capacity   highest arrival rate meeting the SLOs (same overrides as run, plus target=0.9 lo= hi= iters=)
  generate   complete a real prompt through the full engine (model=smollm2-135m prompt="...")
  compare    table, CDFs, markdown and HTML of run or multirun directories (compare --help)
  sim-check  your step-time measurements (CSV) against the sim's cost model: MAPE, bias, worst (sim-check --help)
  fidelity-e2e  your serving benchmark (vllm bench serve JSON, inference-perf report) replayed on the sim, per stage
  reproduce  published scheduling results replayed beside the papers' numbers (reproduce --list, NAME, all)
  features   which features compose on which data plane and topology (one engine, replicas, P/D)
"""


def quoted_list(arg: str, key: str) -> str:
    """`plots.format=png,svg,pdf` → `plots.format='png,svg,pdf'`: one value, not a Hydra sweep."""
    value = arg[len(key):] if arg.startswith(key) else ""
    return f"{key}'{value}'" if "," in value and not value.startswith(("'", '"', "[")) else arg


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    command, rest = argv[0], argv[1:]
    if command == "generate":
        rest = expand_shorthands(rest, "generate", ("prompt", "max_new_tokens", "temperature", "chat"))
    elif command == "capacity":
        from policylab.apps.capacity import job_args
        rest = job_args(rest)
    if command in HYDRA_JOBS:
        rest = [quoted_list(a, "plots.format=") for a in rest]
        check_output_dir_writable(rest)
        from policylab.apps.plugins import check_plugins
        if why := check_plugins(rest, CONFIG_DIR):
            fail(why)
        sys.argv = [f"policylab {command}"] + rest
        HYDRA_JOBS[command]()
        if noted_stop():             # (a signal after the job's own handlers: its files are whole)
            print(f"{signal_name(noted_stop())} received after the job had written its files", file=sys.stderr)
            raise SystemExit(128 + noted_stop())
    elif command in TOOLS:
        default_stop_signals()       # (a tool is stopped the ordinary way)
        raise SystemExit(importlib.import_module(TOOLS[command]).main(rest))
    else:
        fail(f"unknown command '{command}'\n{USAGE}")
