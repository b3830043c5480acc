"""The replays of a reproduction: each one the `run` job's replay, as the command line composes it.

`Context.replay(overrides)` composes the run config from the same config groups and keys as
`python -m policylab run OVERRIDES` (Hydra's compose API), builds the engine or cluster,
replays and summarizes it; nothing is logged to W&B and no plot is drawn. Every replay is kept
as one row of `runs.csv` (arm, replicate, load and its headline metrics), so every number of a
reproduction can be traced to the replays behind it. `Context.capacity` bisects the load
(`trace.rate_scale`) for the highest one an arm sustains under a criterion, with the capacity
command's own search (`policylab.apps.capacity.search`).
"""
from __future__ import annotations

import csv
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from policylab.apps.jobs import RunError

QUIET = ["logger=none", "plots=false", "progress=false"]
RUN_COLUMNS = ("entry", "arm", "replicate", "rate_scale", "requests", "finished", "slo_attainment", "goodput",
               "ttft_p50", "ttft_p99", "tpot_p99", "itl_p99", "queueing_p50", "qoe_mean", "throughput_out",
               "prefix_hit", "makespan", "meets", "seconds")


@dataclass
class Replay:
    summary: dict


class PartialReplay(RunError):
    """A replay that ended partial (a broken contract, a stall): `error` is the engine's reason."""

    def __init__(self, message: str, error: str):
        super().__init__(message)
        self.error = error


@dataclass
class Capacity:
    rate_scale: Optional[float]    # highest scale that met the criterion (None: not even the lowest)
    status: str                    # found | below_range | above_range
    rows: list                     # (rate_scale, summary, meets) of every replay of the search


class Context:
    """What an entry's measurement runs in: where files go, how many replicates, the replays."""

    def __init__(self, entry: str, out_dir: Path, replicates: int, quick: bool = False, log=None):
        if replicates < 1:
            raise RunError(f"reproduce: --replicates must be >= 1, got {replicates}")
        self.entry, self.out_dir, self.replicates, self.quick = entry, Path(out_dir), replicates, quick
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.rows: list = []
        self.partials: list = []       # (arm, replicate, rate_scale, error) of replays counted as misses
        self._log = log or (lambda message: print(message, file=sys.stderr))

    def log(self, message: str) -> None:
        self._log(f"{self.entry}: {message}")

    def path(self, name: str) -> Path:
        """A file of this reproduction (a generated workload, ...), absolute."""
        return (self.out_dir / name).resolve()

    def replay(self, overrides: list, arm: str, replicate: int, policy_class: type | None = None) -> Replay:
        """One replay of `python -m policylab run OVERRIDES` (with `policy_class` as the policy, its
        parameters `policy.*` overrides, as `policylab.replay` takes a class); a replay that ends
        partial raises PartialReplay."""
        from policylab.analysis.results import summarize_run
        from policylab.apps.jobs import build_engine, replay
        from policylab.apps.settings import result_settings
        started = time.process_time()
        run = run_config(overrides, policy_class)
        result = replay(build_engine(run), progress=False)
        if result.partial:
            raise PartialReplay(f"reproduce {self.entry}: the replay of arm '{arm}' (replicate {replicate}) ended "
                                f"partial: {result.error}; overrides: {' '.join(map(str, overrides))}", result.error)
        _, _, summary = summarize_run(result, result_settings(run))
        self._keep(arm, replicate, run.trace.rate_scale, summary, None, time.process_time() - started)
        return Replay(summary)

    def kv_tokens(self, overrides: list) -> int:
        """Tokens the KV cache of this configuration holds (a single engine's), without replaying."""
        from policylab.apps.jobs import build_engine
        engine = build_engine(run_config(overrides))
        return engine.kv.num_blocks * engine.kv.block_size

    def capacity(self, overrides: list, arm: str, replicate: int, meets: Callable[[dict], bool],
                 lo: float, hi: float, iters: int = 5, widen: int = 3, partial_misses: bool = False,
                 policy_class: type | None = None) -> Capacity:
        """The highest `trace.rate_scale` in the bisection whose replay `meets` the criterion.
        `partial_misses`: a replay that ends partial counts as missing the criterion (and is noted)
        instead of stopping the reproduction."""
        from policylab.apps.capacity import search
        from policylab.apps.config import CapacityConfig
        rows: list = []

        def evaluate(scale: float) -> dict:
            try:
                out = self.replay([*overrides, f"trace.rate_scale={scale!r}"], arm, replicate, policy_class)
            except PartialReplay as e:
                if not partial_misses:
                    raise
                self.partials.append((arm, replicate, scale, e.error))
                return {"slo_attainment": 0.0}
            ok = bool(meets(out.summary))
            self.rows[-1]["meets"] = ok
            rows.append((scale, out.summary, ok))
            return {"slo_attainment": 1.0 if ok else 0.0}

        cap = CapacityConfig(target=0.5, lo=lo, hi=hi, iters=iters, widen=widen)
        status, scale, _ = search(evaluate, cap)
        self.log(f"{arm}, replicate {replicate}: capacity at rate_scale "
                 f"{'—' if scale is None else f'{scale:.3g}'} ({status}, {len(rows)} replays)")
        return Capacity(scale, status, sorted(rows, key=lambda r: r[0]))

    def partial_note(self) -> list:
        """One sentence on the replays that ended partial and were counted as misses (none: [])."""
        if not self.partials:
            return []
        loads = ", ".join(f"{arm} at rate_scale {scale:.3g} (replicate {k})" for arm, k, scale, _ in self.partials)
        errors = "; ".join(dict.fromkeys(error for *_, error in self.partials))
        return [f"{len(self.partials)} replays stopped partial and count as missing the criterion: {loads}. "
                f"The engine said: {errors}"]

    def _keep(self, arm: str, replicate: int, scale: float, s: dict, meets, seconds: float) -> None:
        get = lambda section, key: (s.get(section) or {}).get(key)      # noqa: E731
        self.rows.append({
            "entry": self.entry, "arm": arm, "replicate": replicate, "rate_scale": scale,
            "requests": s["counts"]["requests"], "finished": s["counts"]["finished"],
            "slo_attainment": s.get("slo_attainment"), "goodput": s.get("goodput"),
            "ttft_p50": get("ttft", "p50"), "ttft_p99": get("ttft", "p99"), "tpot_p99": get("tpot", "p99"),
            "itl_p99": get("itl", "p99"), "queueing_p50": get("queueing_delay", "p50"),
            "qoe_mean": get("qoe", "mean"), "throughput_out": get("throughput", "output_tokens_per_s"),
            "prefix_hit": s.get("prefix_cache_hit_rate"), "makespan": s.get("makespan"), "meets": meets,
            "seconds": round(seconds, 3)})

    def write_runs(self) -> Path:
        path = self.out_dir / "runs.csv"
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=RUN_COLUMNS)
            writer.writeheader()
            writer.writerows(self.rows)
        return path


def run_config(overrides: list, policy_class: type | None = None):
    """The typed run config `python -m policylab run OVERRIDES` composes (quiet: no W&B, no plots);
    with `policy_class` as the policy, `policy.*` overrides its constructor arguments."""
    from omegaconf import open_dict
    from policylab.apps.config import typed_config
    from policylab.apps.python_api import compose
    params = {o.split("=", 1)[0][len("policy."):]: yaml_value(o.split("=", 1)[1]) for o in overrides
              if policy_class is not None and o.startswith("policy.")}
    strings = [o for o in overrides if policy_class is None or not o.startswith("policy.")]
    cfg = compose([*strings, *QUIET], policy_class, params)
    with open_dict(cfg):
        del cfg["hydra"]
    return typed_config(cfg)


def yaml_value(text: str):
    """An override's value as the YAML scalar it spells (`512` -> 512, `true` -> True)."""
    import yaml
    return yaml.safe_load(text)


def write_workload(path: Path, requests: list) -> Path:
    """A generated workload as a native JSONL trace (`trace=file trace.path=PATH` replays it)."""
    from policylab.traces.native import write_native
    path.parent.mkdir(parents=True, exist_ok=True)
    write_native(path, requests)
    return path
