"""What every Hydra job shares: typed building of trace, policy, data plane and engine, the
progress bar, and user errors turned into one clear message."""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate

from policylab.apps.config import RunConfig, typed_dataplane
from policylab.apps.errors import RunError  # noqa: F401  (importable from here)
from policylab.apps.config_checks import check_workload
from policylab.cluster.config import is_cluster
from policylab.apps.signals import ReplaySignals
from policylab.core.engine import Engine
from policylab.core.policy import Policy
from policylab.core.result import RunResult, mark_partial
from policylab.dataplane import build_dataplane
from policylab.traces import TraceError, load_trace


PREVIOUS_RESULTS = ("summary.json", "requests.parquet", "steps.parquet", "capacity.json", "capacity.csv",
                    "error.txt", "traceback.txt")


def fail(message: str, code: int = 2):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def guarded_job(body):
    """Run a Hydra job body in its output directory, with user errors turned into one message.

    Result files an earlier run left in the directory are set aside first (`*.previous.*`), so a
    re-run that fails never leaves an old "complete" summary beside the new config. A failed
    job's message is also written to `error.txt`, where the sweep report (sweep_report.py) reads it.
    """
    from policylab.analysis.results import ResultsWriteError
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    set_aside_previous_results(run_dir)
    code = 2
    try:
        return body(run_dir)
    except (RunError, TraceError, ResultsWriteError, ValueError, OSError) as e:
        message = str(e)
    except Exception as e:           # anything else: this job failed, a sweep goes on to the next
        import traceback
        path = write_traceback(run_dir, traceback.format_exc())
        message, code = f"{type(e).__name__}: {e} (traceback: {path})", 1
    except KeyboardInterrupt as e:   # a stop signal before the replay started (ReplaySignals)
        name = str(e) or "SIGINT"
        message = f"stopped ({name}) before any results were written"
        code = 128 + getattr(signal.Signals, name, signal.SIGINT)
    write_error_file(run_dir, message)
    fail(message, code)


def write_error_file(run_dir: Path, message: str) -> None:
    """`error.txt` with the message, or none at all (a full disk must not leave an empty one)."""
    path = run_dir / "error.txt"
    try:
        path.write_text(message + "\n")
    except OSError:
        try:
            path.unlink(missing_ok=True)    # (an unwritable run directory is the message itself)
        except OSError:
            pass


def check_output_dir_writable(overrides: list) -> None:
    """Hydra itself would end with a logging traceback: refuse an output directory that cannot be
    created, naming it (the nearest existing folder above the configured one must be writable)."""
    multirun = any(a in ("-m", "--multirun") for a in overrides)
    key = "hydra.sweep.dir=" if multirun else "hydra.run.dir="
    given = next((a[len(key):] for a in overrides if a.startswith(key)), "multirun" if multirun else "outputs")
    folder = Path(given.split("${", 1)[0] or ".").expanduser().absolute()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        fail(f"cannot write the output directory {given.rstrip('/')}: {existing} is not a writable folder "
             f"(set {key}DIR to a folder you can write)")


def set_aside_previous_results(run_dir: Path) -> None:
    """Rename result files of an earlier run in `run_dir` to `*.previous.*` (compare skips them)."""
    for name in PREVIOUS_RESULTS:
        old = run_dir / name
        if old.is_file():
            old.replace(old.with_name(f"{old.stem}.previous{old.suffix}"))
            print(f"note: {old} of an earlier run in this directory renamed to *.previous{old.suffix}",
                  file=sys.stderr)


def in_multirun() -> bool:
    from hydra.types import RunMode
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def expand_shorthands(args: list, section: str, keys) -> list:
    """`prompt=...` → `generate.prompt=...`: short overrides for one job's own config section."""
    return [f"{section}.{a}" if a.split("=", 1)[0] in keys else a for a in args]


def build_policy(spec: dict) -> Policy:
    """The policy a `_target_` dict names, its parameters passed as plain Python values."""
    try:
        policy = instantiate(dict(spec), _convert_="all")
    except Exception as e:
        cause = e.__cause__ or e          # (Hydra wraps the policy's own error in two lines)
        raise RunError(f"cannot build policy from {dict(spec)}: {type(cause).__name__}: "
                       f"{str(cause).splitlines()[-1] if str(cause) else ''}") from None
    if not callable(getattr(policy, "schedule", None)):
        raise RunError(f"policy {type(policy).__name__} has no schedule(view) method")
    return policy


def dataplane_of(cfg: RunConfig):
    return build_dataplane(typed_dataplane(cfg.dataplane), cfg.model, cfg.hardware, cfg.seed)


def measuring(cfg: RunConfig, command: str) -> RunConfig:
    """`cfg` with the real plane's step times measured: what calibrate and fidelity compare the
    sim against (`step_time=auto` times CPU steps by the cost model, which they would fit to itself)."""
    if cfg.dataplane.step_time == "model":
        raise RunError(f"{command} measures the real data plane: dataplane.step_time=model would time it "
                       "by the sim it is compared with; use dataplane.step_time=measured (or auto)")
    return dataclasses.replace(cfg, dataplane=dataclasses.replace(cfg.dataplane, step_time="measured"))


def build_engine(cfg: RunConfig, dataplane=None, trace=None) -> Engine:
    """The run's engine, or its cluster of engines (`cluster.*`: same run/trace interface)."""
    trace = load_trace(cfg.trace, seed=cfg.seed) if trace is None else trace
    check_workload(cfg, trace)
    if is_cluster(cfg.cluster):
        from policylab.apps.cluster_build import build_cluster
        engine = build_cluster(cfg, build_policy, trace)
        if any(hasattr(r.engine.policy, "attach_clock") for r in engine.replicas):
            raise RunError("a policy that sets the GPU clock (energy_aware) runs on a single engine: "
                           "cluster.* has several; use chunked in the cluster, or run one replica")
        return engine
    from policylab.apps.engine_build import engine_of
    refuse_router_features(cfg, trace)
    return engine_of(cfg, trace, build_policy(cfg.policy), dataplane or dataplane_of(cfg),
                     getattr(trace, "sessions", None))


def refuse_router_features(cfg: RunConfig, trace, topology: str = "engine", plane=None) -> None:
    """A router that migrates (router=llumnix) on a run that builds no cluster: refused in the one
    line the feature table gives (`migration` runs on replicas)."""
    from policylab.apps.cluster_build import spec_features
    from policylab.core.features import check_combination, features_of
    extra = spec_features(cfg.router)
    if extra:
        sessions = getattr(trace, "sessions", None)
        features = features_of(trace or [], cfg.engine, build_policy(cfg.policy), sessions, cfg.speculative.k,
                               cfg.trace.client_timeout) | extra
        check_combination(features, None, plane, topology, cfg.engine)


def replay(engine: Engine, progress: bool | str = True, signals: ReplaySignals | None = None,
           on_request_done=None, label: str = "") -> RunResult:
    """Run the engine with a progress bar over requests (finished + rejected); `on_request_done`
    (e.g. a results stream's) is called with each request's id as well. `progress="lines"`
    (jobs running side by side) prints whole lines instead, `label: 25% (50/200 requests)` at
    each quarter: bars redrawn by several processes on one terminal interleave.
    `progress="transient"` (the Python API): one bar that is cleared when the replay ends.

    With `signals`, a stop signal ends the replay like Ctrl-C, and from the moment the engine
    returns, signals only get noted (`shield`): the caller writes the results undisturbed.
    """
    result = None
    try:
        try:
            if not progress:
                result = engine.run(on_request_done)
            elif progress == "lines":
                result = engine.run(on_request_done=ProgressLines(len(engine.trace), label or engine.policy_name,
                                                                  on_request_done))
            else:
                from tqdm import tqdm
                with tqdm(total=len(engine.trace), unit="req", desc=engine.policy_name, file=sys.stderr,
                          dynamic_ncols=True, mininterval=0.5, leave=progress != "transient") as bar:
                    done = on_request_done or (lambda _: None)
                    result = engine.run(on_request_done=lambda rid: (done(rid), bar.update()))
        finally:
            if signals is not None:
                signals.shield()
    except BaseException as e:    # a signal landing just outside the engine's own guard
        if result is None:
            result = salvage(engine, e)
    return result


class ProgressLines:
    """Progress as whole lines, one write each (a write this short reaches a pipe or terminal in
    one piece, so lines of jobs running side by side never mix)."""

    def __init__(self, total: int, label: str, then=None, parts: int = 4):
        self.total, self.label, self.then, self.done = total, label, then, 0
        self.marks = sorted({max(1, total * k // parts) for k in range(1, parts + 1)}) if total else []

    def __call__(self, rid: int) -> None:
        if self.then is not None:
            self.then(rid)
        self.done += 1
        if self.marks and self.done == self.marks[0]:
            self.marks.pop(0)
            sys.stderr.write(f"{self.label}: {100 * self.done // self.total}% ({self.done}/{self.total} requests)\n")
            sys.stderr.flush()


def salvage(engine: Engine, e: BaseException) -> RunResult:
    """The engine's (or cluster's) result so far, marked partial (call it inside the `except`)."""
    result = engine.result
    mark_partial(result, e)
    engine.stopped()
    result.steps = engine.steps
    return result


def sweep_group() -> str | None:
    """In a Hydra multirun: the sweep directory's last two parts (e.g. `2025-01-02_10-11-12`)."""
    return "_".join(Path(HydraConfig.get().sweep.dir).parts[-2:]) if in_multirun() else None


def run_name(run_dir: Path) -> str:
    """The run directory's name, plus a sweep job's overrides but policy and trace (already in
    it): W&B run names then say what was swept (`4_chunked_multitenant trace.rate_scale=16 ...`)."""
    if not in_multirun():
        return run_dir.name
    return " ".join([run_dir.name, *(o for o in HydraConfig.get().overrides.task
                                     if not o.startswith(("policy=", "trace=")))])


def in_parallel_launcher() -> bool:
    """A multirun whose jobs run side by side (joblib, Ray, ...): their terminal output interleaves."""
    return in_multirun() and not str(HydraConfig.get().launcher.get("_target_", "")).endswith("BasicLauncher")


TRACEBACK_FILE = "traceback.txt"


def write_traceback(run_dir: Path, text: str) -> Path:
    """The exception's traceback in the run directory (the summary carries only its last line)."""
    path = Path(run_dir) / TRACEBACK_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:
        print(f"could not write {path}: {e}\n{text}", file=sys.stderr)
    return path
