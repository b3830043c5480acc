"""One replay: build trace, data plane, policy and engine from a config; write and report results."""
from __future__ import annotations

import sys
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from policylab.config import DataplaneConfig, HardwareConfig, ModelConfig
from policylab.dataplane import build_dataplane
from policylab.engine import Engine
from policylab.run_result import RunResult
from policylab.policy import Policy
from policylab.traces import load_trace


class RunError(Exception):
    """A user-facing problem (bad config, bad trace): printed as one message, no traceback."""


def typed(cls, node):
    """Build a config dataclass from a node, naming unknown fields clearly."""
    data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    try:
        return cls(**data)
    except TypeError as e:
        raise RunError(f"config '{cls.__name__}': {e}") from None


def build_policy(policy_cfg) -> Policy:
    try:
        policy = instantiate(policy_cfg)
    except Exception as e:
        raise RunError(f"cannot build policy from {OmegaConf.to_container(policy_cfg)}: {e}") from None
    if not callable(getattr(policy, "schedule", None)):
        raise RunError(f"policy {type(policy).__name__} has no schedule(view) method")
    return policy


def dataplane_of(cfg: DictConfig):
    return build_dataplane(typed(DataplaneConfig, cfg.dataplane), typed(ModelConfig, cfg.model),
                           typed(HardwareConfig, cfg.hardware), cfg.seed)


def build_engine(cfg: DictConfig, dataplane=None) -> Engine:
    trace = load_trace(cfg.trace, seed=cfg.seed)
    return Engine(trace, build_policy(cfg.policy), dataplane or dataplane_of(cfg), cfg.engine,
                  seed=cfg.seed, prefix_block_tokens=cfg.trace.prefix_block_tokens)


def replay(engine: Engine, progress: bool = True) -> RunResult:
    """Run the engine with a progress bar over requests (finished + rejected)."""
    if not progress:
        return engine.run()
    from tqdm import tqdm
    with tqdm(total=len(engine.trace), unit="req", desc=engine.policy_name, file=sys.stderr,
              dynamic_ncols=True, mininterval=0.5) as bar:
        return engine.run(on_request_done=lambda _: bar.update())


def run(cfg: DictConfig, run_dir: Path) -> dict:
    """The `python -m policylab run` job: replay, then write files, log and print the summary."""
    from policylab.results import print_summary, write_results
    from policylab.tracking import open_tracker

    engine = build_engine(cfg)
    tracker = open_tracker(cfg, run_dir)
    result = replay(engine, cfg.progress)
    summary = write_results(run_dir, result, cfg)
    if cfg.plots:
        from policylab.plots import write_run_plots
        write_run_plots(run_dir)
    tracker.log_run(run_dir, summary)
    tracker.finish()
    print_summary(summary)
    print(f"results: {run_dir}")
    if result.partial:
        print(f"run ended early: {result.error} — partial results written to {run_dir}", file=sys.stderr)
    return summary
