"""What every Hydra job shares: typed building of trace, policy, data plane and engine, the
progress bar, and user errors turned into one clear message."""
from __future__ import annotations

import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate

from policylab.apps.config import RunConfig
from policylab.core.engine import Engine
from policylab.core.policy import Policy
from policylab.core.result import RunResult
from policylab.dataplane import build_dataplane
from policylab.traces import TraceError, load_trace


class RunError(Exception):
    """A user-facing problem (bad config, bad trace): printed as one message, no traceback."""


def fail(message: str, code: int = 2):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def guarded_job(body):
    """Run a Hydra job body in its output directory, with user errors turned into one message."""
    from policylab.analysis.results import ResultsWriteError
    try:
        return body(Path(HydraConfig.get().runtime.output_dir))
    except (RunError, TraceError, ResultsWriteError, ValueError, FileNotFoundError) as e:
        fail(str(e))


def expand_shorthands(args: list, section: str, keys) -> list:
    """`prompt=...` → `generate.prompt=...`: short overrides for one job's own config section."""
    return [f"{section}.{a}" if a.split("=", 1)[0] in keys else a for a in args]


def build_policy(spec: dict) -> Policy:
    """The policy a `_target_` dict names, its parameters passed as plain Python values."""
    try:
        policy = instantiate(dict(spec), _convert_="all")
    except Exception as e:
        raise RunError(f"cannot build policy from {dict(spec)}: {e}") from None
    if not callable(getattr(policy, "schedule", None)):
        raise RunError(f"policy {type(policy).__name__} has no schedule(view) method")
    return policy


def dataplane_of(cfg: RunConfig):
    return build_dataplane(cfg.dataplane, cfg.model, cfg.hardware, cfg.seed)


def build_engine(cfg: RunConfig, dataplane=None) -> Engine:
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


def sweep_group() -> str | None:
    """In a Hydra multirun: the sweep directory's last two parts (e.g. `2025-01-02_10-11-12`)."""
    from hydra.types import RunMode
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return "_".join(Path(HydraConfig.get().sweep.dir).parts[-2:])
