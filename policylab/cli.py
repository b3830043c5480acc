"""`python -m policylab SUBCOMMAND ...`: Hydra jobs (run) and plain tools (trace, compare, ...).

Hydra rejects a bare subcommand word before its overrides, so the word is taken off
argv here and the rest handed to the `@hydra.main` function.
"""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from policylab.config import register

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")
register()


def fail(message: str, code: int = 2):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def run_main(cfg: DictConfig) -> float:
    from policylab.run import run
    summary = guarded_job(lambda run_dir: run(cfg, run_dir))
    if summary.get("status") != "complete":
        raise SystemExit(1)
    return float(summary.get("goodput") or 0.0)   # objective for Hydra sweepers (Optuna)


def guarded_job(body):
    """Run a Hydra job body with user errors turned into one clear message."""
    from policylab.results import ResultsWriteError
    from policylab.run import RunError
    from policylab.traces import TraceError
    try:
        return body(Path(HydraConfig.get().runtime.output_dir))
    except (RunError, TraceError, ResultsWriteError, ValueError, FileNotFoundError) as e:
        fail(str(e))


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def calibrate_main(cfg: DictConfig) -> None:
    from policylab.calibrate import calibrate
    from policylab.run import build_engine, dataplane_of

    def body(run_dir: Path):
        plane = dataplane_of(cfg)
        return calibrate(plane, cfg.engine, run_dir, cfg.seed, build_engine(cfg, plane))
    guarded_job(body)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def fidelity_main(cfg: DictConfig) -> None:
    from policylab.fidelity import fidelity
    guarded_job(lambda run_dir: fidelity(cfg, run_dir))


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def generate_main(cfg: DictConfig) -> None:
    from policylab.config import DataplaneConfig, EngineConfig, GenerateConfig, ModelConfig
    from policylab.dataplane.generate import generate_text
    from policylab.run import typed

    def body(run_dir: Path) -> None:
        g = typed(GenerateConfig, cfg.generate)
        text = generate_text(typed(ModelConfig, cfg.model), typed(DataplaneConfig, cfg.dataplane), g.prompt,
                             g.max_new_tokens, g.temperature, g.top_k, g.top_p, cfg.seed, g.chat,
                             typed(EngineConfig, cfg.engine))
        print(f"{g.prompt}\n--- {cfg.model.name} ---\n{text}")
    guarded_job(body)


def expand_shorthands(args: list, section: str, keys) -> list:
    """`prompt=...` → `generate.prompt=...`: short overrides for one job's own config section."""
    return [f"{section}.{a}" if a.split("=", 1)[0] in keys else a for a in args]


def capacity_main() -> None:
    from policylab.capacity import main as capacity
    capacity()


TOOLS = {
    "trace": "policylab.traces.cli",
    "compare": "policylab.compare",
}
HYDRA_JOBS = {"run": run_main, "calibrate": calibrate_main, "fidelity": fidelity_main,
              "capacity": capacity_main, "generate": generate_main}
USAGE = """usage: python -m policylab COMMAND ...

  run        replay a trace under a policy (Hydra overrides: policy=chunked trace=bursty ...; -m for sweeps)
  trace      inspect, convert or generate arrival traces (python -m policylab trace --help)
  calibrate  profile the real data plane (a grid of batches + a replay of the trace), fit the sim
  fidelity   replay on the real data plane and on the calibrated sim; report per-metric error
  capacity   highest arrival rate meeting the SLOs (same overrides as run, plus target=0.9 lo= hi= iters=)
  generate   complete a real prompt through the full engine (model=smollm2-135m prompt="...")
  compare    table, CDFs, markdown and HTML of run or multirun directories (compare --help)
"""


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    command, rest = argv[0], argv[1:]
    if command in HYDRA_JOBS:
        if command == "generate":
            rest = expand_shorthands(rest, "generate", ("prompt", "max_new_tokens", "temperature", "chat"))
        sys.argv = [f"policylab {command}"] + rest
        HYDRA_JOBS[command]()
    elif command in TOOLS:
        import importlib
        raise SystemExit(importlib.import_module(TOOLS[command]).main(rest))
    else:
        fail(f"unknown command '{command}'\n{USAGE}")
