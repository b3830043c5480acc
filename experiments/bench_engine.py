"""Control-plane speed of the engine (not a test; numbers go in closing notes).

(a) sim-mode replay of a generated 20,000-request trace (Poisson 5.5 req/s, prompts
    mean ~1,000, outputs mean ~200) with prefill_first — wall seconds (target ≤ 20 s);
(b) control-plane time per step with 256 running decodes (engine + policy + validation,
    data plane excluded) — µs per step (target ≤ 150 µs).
(c) the user's path: `python -m policylab run policy=P trace=file trace.path=<20,000-request
    conversation-shaped trace> dataplane=sim` as the CLI runs it (Hydra compose, typed config,
    replay, result files, plots, the default offline W&B logger), in-process, with the split
    between trace load, replay, results, plots and W&B (target ≤ 20 s end to end).
Usage: python experiments/bench_engine.py [--requests 20000] [--policy prefill_first] [--repeat 1]
       [--only a,b,c] [--cost-model roofline]
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import yaml

from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
try:
    from policylab.dataplane.config import DataplaneConfig
except ImportError:            # an older checkout (count_instructions.py --against runs this file there)
    from policylab.core.config import DataplaneConfig
from policylab.dataplane.sim import SimDataPlane
from policylab.core.engine import Engine
from policylab.core.request import TraceRequest
from policylab.testing.loader import load_policy as load_policy_spec

ROOT = Path(__file__).resolve().parents[1]     # configs/ are read from the checkout, from any cwd


def lognormal_lengths(rng, mean, sigma, n, cap):
    return np.clip(rng.lognormal(np.log(mean) - sigma ** 2 / 2, sigma, n), 1, cap).astype(int)


def make_trace(n, rate, prompt_mean, output_mean, seed=0):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    prompts = lognormal_lengths(rng, prompt_mean, 0.8, n, 6000)
    outputs = lognormal_lengths(rng, output_mean, 0.8, n, 2000)
    return [TraceRequest(float(a), int(p), int(o)) for a, p, o in zip(arrivals, prompts, outputs)]


PINNED = {"prefill_first": {"watermark": 0.0}}   # the published figures predate prefill_first's watermark


def load_policy(name):
    if name in PINNED:       # (an older checkout, for count_instructions.py --against: the options it
        spec = {**yaml.safe_load(open(ROOT / f"configs/policy/{name}.yaml")), **PINNED[name]}   # has)
        module, cls = spec["_target_"].rsplit(".", 1)
        takes = inspect.signature(getattr(importlib.import_module(module), cls)).parameters
        return load_policy_spec({k: v for k, v in spec.items() if k == "_target_" or k in takes})
    return load_policy_spec(str(ROOT / f"configs/policy/{name}.yaml"))      # resolves ${fairness.*} / ${slo.*} too


COST_MODEL = "shaped"        # --cost-model


def sim_plane():
    model = ModelConfig(**yaml.safe_load(open(ROOT / "configs/model/llama3-8b.yaml")))
    if dataclasses.is_dataclass(DataplaneConfig):      # (older checkouts: one config class, maybe no cost models)
        fields = {"cost_model": COST_MODEL} if "cost_model" in {f.name for f in dataclasses.fields(DataplaneConfig)} else {}
    else:                                              # a config per plane kind, built from its values
        fields = {"cost_model": COST_MODEL}
    if not fields and COST_MODEL != "roofline":
        sys.exit(f"this checkout's sim has no cost model '{COST_MODEL}' (only the roofline): use --cost-model roofline")
    return SimDataPlane(model, HardwareConfig(), DataplaneConfig(kind="sim", **fields))


def replay_engine(n, policy):
    """(a)'s engine: the generated n-request trace on the sim plane, default budgets."""
    return Engine(make_trace(n, 5.5, 1000, 200), load_policy(policy), sim_plane(), EngineConfig())


def steady_engine(policy, running, outputs):
    """(b)'s engine, stepped until `running` requests all decode (each has `outputs` tokens to go)."""
    trace = [TraceRequest(0.0, 64, outputs) for _ in range(running)]
    cfg = EngineConfig(max_num_seqs=running, max_num_batched_tokens=running * 64)
    engine = Engine(trace, load_policy(policy), sim_plane(), cfg)
    for _ in range(300):    # admit and prefill everyone (chunked: 512 tokens a step); then all decode
        engine.step()
        if len(engine.running) == running and all(v.is_decode for v in engine._view().running):
            return engine
    raise RuntimeError(f"{policy}: never reached {running} running decodes")


def bench_replay(n, policy):
    engine = replay_engine(n, policy)
    t0 = time.perf_counter()
    result = engine.run()
    wall = time.perf_counter() - t0
    steps = len(result.steps["clock"])
    print(f"(a) {n} requests, {policy}: {wall:.2f} s wall, {steps} steps, "
          f"{wall / steps * 1e6:.0f} µs/step, replayed {engine.clock.now:.0f} s of trace, status {result.status}")
    return wall


def timed_steps(policy, running, steps):
    """(total, data plane) wall seconds of `steps` steps of a steady engine of `running` decodes."""
    engine = steady_engine(policy, running, steps + 100)
    plane = engine.dataplane
    plane_time = 0.0
    execute = plane.execute

    def timed_execute(batch):
        nonlocal plane_time
        t = time.perf_counter()
        out = execute(batch)
        plane_time += time.perf_counter() - t
        return out
    plane.execute = timed_execute
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return time.perf_counter() - t0, plane_time


def bench_decode_step(policy, running=256, steps=1000):
    total, plane_time = timed_steps(policy, running, steps)
    control = total - plane_time
    print(f"(b) {policy}: {control / steps * 1e6:.0f} µs/step control plane with {running} running "
          f"decodes (sim data plane excluded: {plane_time / steps * 1e6:.0f} µs/step, control/sim "
          f"{control / plane_time:.1f}x: the steadier number under load)")


CONVERSATION = ["--kind", "poisson", "--rate", "5.5", "--prompt-len", "lognormal:mean=1150,p90=2300,max=8000",
                "--output-len", "lognormal:mean=210,p90=450,max=2000", "--seed", "0"]   # Azure-conversation-like


@contextmanager
def timed_calls(split: dict):
    """Time what the run job calls, where the job looks the callees up (module attributes)."""
    import policylab.analysis.plots as plots
    import policylab.analysis.results as results
    import policylab.analysis.tracking as tracking
    import policylab.apps.jobs as jobs
    import policylab.apps.run as run

    def wrap(fn, bucket):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                split[bucket] = split.get(bucket, 0.0) + time.perf_counter() - t
        return timed

    def open_tracker(*args, **kwargs):
        tracker = wrap(original["open_tracker"], "W&B")(*args, **kwargs)
        tracker.log_run, tracker.finish = wrap(tracker.log_run, "W&B"), wrap(tracker.finish, "W&B")
        return tracker

    targets = [(jobs, "load_trace", "trace load"), (run, "load_trace", "trace load"), (run, "replay", "replay"), (results, "write_results", "results"),
               (results.ResultStream, "finish", "results"), (plots, "write_run_plots", "plots")]
    original = {(mod, name): getattr(mod, name) for mod, name, _ in targets}
    original["open_tracker"] = tracking.open_tracker
    for mod, name, bucket in targets:
        setattr(mod, name, wrap(getattr(mod, name), bucket))
    tracking.open_tracker = open_tracker
    try:
        yield
    finally:
        for mod, name, _ in targets:
            setattr(mod, name, original[mod, name])
        tracking.open_tracker = original["open_tracker"]


def bench_cli(n, policy):
    """(c): the run job exactly as `python -m policylab run ...` composes it, timed end to end."""
    from policylab.apps.cli import main
    from policylab.apps.trace_cli import main as trace_main
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "conversation.jsonl"
        trace_main(["generate", "-n", str(n), *CONVERSATION, "-o", str(trace)])
        split = {}
        argv = ["run", f"policy={policy}", *(f"policy.{k}={v}" for k, v in PINNED.get(policy, {}).items()),
                "trace=file", f"trace.path={trace}", "dataplane=sim", f"dataplane.cost_model={COST_MODEL}",
                f"hydra.run.dir={tmp}/run", "progress=false"]
        with timed_calls(split):
            t0 = time.perf_counter()
            try:
                main(argv)
            except SystemExit as e:
                if e.code:
                    raise
            wall = time.perf_counter() - t0
    parts = ", ".join(f"{k} {v:.2f} s" for k, v in split.items())
    print(f"(c) CLI run job, {n} requests, {policy}: {wall:.2f} s end to end ({parts}; "
          f"the rest {wall - sum(split.values()):.2f} s: compose, build, summary table)")
    return wall


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--policy", default="prefill_first")
    ap.add_argument("--repeat", type=int, default=1,
                    help="replays of (a), each from a fresh engine: on a shared, noisy machine one "
                         "number says little; the min is the least disturbed, the median the typical")
    ap.add_argument("--only", default="a,b,c", help="which measurements to run (comma-separated)")
    ap.add_argument("--cost-model", default="shaped", help="the sim's cost model (shaped | roofline | kernel)")
    args = ap.parse_args()
    COST_MODEL = args.cost_model
    only = set(args.only.split(","))
    if "b" in only:
        bench_decode_step(args.policy)
    for part, bench in (("a", bench_replay), ("c", bench_cli)):
        if part not in only:
            continue
        walls = sorted(bench(args.requests, args.policy) for _ in range(args.repeat))
        if args.repeat > 1:
            print(f"({part}) {args.repeat} runs: min {walls[0]:.2f} s, median {statistics.median(walls):.2f} s, "
                  f"max {walls[-1]:.2f} s wall", file=sys.stdout)
