"""Speed of the cluster loop (not a test; numbers go in closing notes).

N replicas of the sim plane (Llama-3-8B shape on an H100), `prefill_first` on each, a router
over them, on a conversation-shaped trace from the project's generator (Poisson arrivals;
prompts lognormal mean 1,150 / p90 2,400; outputs mean 210 / p90 450: Azure's conversation
trace's means) at N x 5.5 req/s. Prints the cluster's wall and CPU seconds (target ≤ 60 s for 8
replicas and 150,000 requests) beside one replica replaying alone the share round_robin gives
replica 0 (every N-th request, ~5.5 req/s: the same steps it runs in the cluster), and the ratio
cluster / (N x single) of CPU seconds: what the cluster loop adds over N separate replays.

Measured twice, each measurement in a fresh process (started by this script, one after another):
  direct — `Cluster.run()` against `Engine.run()` (the loops alone, every result kept in memory);
  job    — the `run` job a user starts, `policylab.apps.cli.main(["run", ...])` in process, on the
           same traces written to parquet (--trace-dir): trace loading, building the replicas, the
           replay with its results stream (requests.parquet written and forgotten as it goes),
           steps.parquet, summary.json, and `logger` (none here; --logger wandb: offline W&B).
The job's engine settings are the direct run's (engine.max_model_len=8192), so both replay the
same decisions. The default router, round_robin, reads no load, so the cluster replays replica
by replica through stretches of arrivals (`Cluster._loop_by_replica`); a load-reading router
(`--router least_loaded`) takes the turn-by-turn loop, and places requests differently. CPU seconds are the measuring process's (getrusage): on a shared box they are the
steadier figure (wall exceeds CPU when other work holds the cores); --repeats N keeps the least.
Usage: python experiments/bench_cluster.py [--requests 150000] [--replicas 8] [--router round_robin]
                                           [--skip direct|job] [--repeats 1] [--trace-dir /tmp] [--logger none]
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import io
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import yaml

from bench_scale import RssSampler
from policylab.cluster import Cluster, Replica
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.core.engine import Engine
from policylab.dataplane.sim import SimDataPlane
from policylab.testing.loader import load_policy
from policylab.traces.arrivals import ArrivalProcess
from policylab.traces.generate import ClientSpec, generate_trace
from policylab.traces.lengths import LengthDist

RATE_PER_REPLICA = 5.5

ROOT = Path(__file__).resolve().parents[1]     # configs/ are read from the checkout, from any cwd


def conversation_trace(n: int, rate: float, seed: int = 0) -> list:
    client = ClientSpec("chat", ArrivalProcess("poisson", rate=rate),
                        LengthDist("lognormal", mean=1150, at=2400, max=6000),
                        LengthDist("lognormal", mean=210, at=450, max=2000))
    return generate_trace([client], n, seed)


PINNED = {"prefill_first": {"watermark": 0.0}}   # the published figures predate prefill_first's watermark


def engine(trace: list, policy: str) -> Engine:
    model = ModelConfig(**yaml.safe_load(open(ROOT / "configs/model/llama3-8b.yaml")))
    plane = SimDataPlane(model, HardwareConfig(), DataplaneConfig(kind="sim"))
    spec = str(ROOT / f"configs/policy/{policy}.yaml")
    if policy in PINNED:
        spec = {**yaml.safe_load(open(spec)), **PINNED[policy]}
    return Engine(trace, load_policy(spec), plane, EngineConfig(), prefix_block_tokens=512)


def router(name: str):
    """configs/router/NAME.yaml's router, seed 0."""
    spec = yaml.safe_load(open(ROOT / f"configs/router/{name}.yaml"))
    module, _, cls = spec.pop("_target_").rpartition(".")
    return getattr(importlib.import_module(module), cls)(**{**spec, "seed": 0})


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(run) -> tuple:
    """(wall seconds, CPU seconds of this process, result)."""
    gc.collect()
    wall, cpu = time.perf_counter(), cpu_seconds()
    result = run()
    return time.perf_counter() - wall, cpu_seconds() - cpu, result


def job(trace_path: Path, run_dir: Path, args, replicas: int, *extra: str) -> dict:
    """The `run` job on a trace file, in process (what it prints kept off the terminal)."""
    from policylab.apps.cli import main as cli
    overrides = ["run", f"policy={args.policy}", *(f"policy.{k}={v}" for k, v in PINNED.get(args.policy, {}).items()),
                 "trace=file", f"trace.path={trace_path}", "dataplane=sim",
                 "model=llama3-8b", "hardware=h100", "engine.max_model_len=8192", f"logger={args.logger}",
                 "progress=false", "plots=false", f"hydra.run.dir={run_dir}"]
    if replicas > 1:
        overrides += [f"cluster.replicas={replicas}", f"router={args.router}"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            cli([*overrides, *extra])
        except SystemExit as e:
            if e.code not in (0, None):
                raise
    return json.loads((run_dir / "summary.json").read_text())


def measure(what: str, args) -> dict:
    """One measurement, in this (fresh) process: wall and CPU seconds and what it ran."""
    n, k = args.requests, args.replicas
    if what.startswith("direct"):
        trace = conversation_trace(n, k * RATE_PER_REPLICA)
        engine(trace[0::k][:50], args.policy).run()     # one-time costs of a process (first numpy calls, ...)
        if what == "direct-single":
            run = engine(trace[0::k], args.policy).run
        else:
            run = Cluster(trace, [Replica(i, "colocated", "h100", engine(trace, args.policy)) for i in range(k)],
                          router(args.router)).run
        wall, cpu, result = timed(run)
        return {"wall": wall, "cpu": cpu, "steps": len(result.steps["clock"]), "status": result.status,
                "requests": len(result.trace)}
    paths = trace_files(args)
    run_dir = args.trace_dir / f"bench_cluster_runs_{n}_{k}"
    job(paths["share"], run_dir / "warm_up", args, k, "trace.max_requests=50")    # imports, first compose
    sampler = RssSampler()
    sampler.start()
    if what == "job-single":
        wall, cpu, summary = timed(lambda: job(paths["share"], run_dir / "single", args, 1))
    else:
        wall, cpu, summary = timed(lambda: job(paths["cluster"], run_dir / "cluster", args, k))
    sampler.stop.set()
    return {"wall": wall, "cpu": cpu, "status": summary["status"], "finished": summary["counts"]["finished"],
            "rss": max(sampler.samples, default=0) / 2**30, "run_dir": str(run_dir)}


def trace_files(args) -> dict:
    """The cluster's trace and replica 0's share as parquet files (written once)."""
    n, k = args.requests, args.replicas
    paths = {name: args.trace_dir / f"bench_cluster_{name}_{n}_{k}.parquet" for name in ("cluster", "share")}
    if not all(p.exists() for p in paths.values()):
        from policylab.traces.parquet import write_parquet
        trace = conversation_trace(n, k * RATE_PER_REPLICA)
        write_parquet(paths["cluster"], trace)
        write_parquet(paths["share"], trace[0::k])
    return paths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=150_000)
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--policy", default="prefill_first")
    p.add_argument("--router", default="round_robin")
    p.add_argument("--skip", choices=["direct", "job"], default=None)
    p.add_argument("--repeats", type=int, default=1, help="measure each this many times (alternating); the least CPU counts")
    p.add_argument("--trace-dir", type=Path, default=Path("/tmp"))
    p.add_argument("--logger", default="none", help="none (default) or wandb (offline)")
    p.add_argument("--measure", default=None, help=argparse.SUPPRESS)     # (one measurement, in a child process)
    args = p.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args)))
        return
    n, k = args.requests, args.replicas
    kinds = [kind for kind in ("direct", "job") if kind != args.skip]
    if "job" in kinds:
        trace_files(args)
    child = [sys.executable, __file__, *sys.argv[1:]]
    best: dict = {}
    for _ in range(args.repeats):
        for what in [f"{kind}-{part}" for kind in kinds for part in ("single", "cluster")]:
            out = subprocess.run([*child, "--measure", what], capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"{what} failed:\n{out.stderr[-3000:]}")
            m = json.loads(out.stdout.strip().splitlines()[-1])
            if what not in best or m["cpu"] < best[what]["cpu"]:
                best[what] = m
    tries = f", least CPU of {args.repeats} runs each" if args.repeats > 1 else ""
    if "direct" in kinds:
        single, cluster = best["direct-single"], best["direct-cluster"]
        print(f"direct, single replica: {single['requests']:,} requests (every {k}th) at ~{RATE_PER_REPLICA} req/s: "
              f"{single['wall']:.1f} s wall, {single['cpu']:.1f} s CPU ({single['steps']:,} steps, {single['status']})")
        print(f"direct, cluster: {k} replicas, {args.router}, {n:,} requests at {k * RATE_PER_REPLICA:g} req/s: "
              f"{cluster['wall']:.1f} s wall, {cluster['cpu']:.1f} s CPU ({cluster['steps']:,} steps, "
              f"{1e6 * cluster['cpu'] / max(cluster['steps'], 1):.1f} µs CPU/step, {cluster['status']}) = "
              f"{cluster['cpu'] / (k * single['cpu']):.2f}x the CPU of {k} single-replica replays (target ≤ 60 s"
              f"{tries})")
    if "job" in kinds:
        single, cluster = best["job-single"], best["job-cluster"]
        print(f"job, single replica: `run` on the share: {single['wall']:.1f} s wall, {single['cpu']:.1f} s CPU "
              f"({single['status']}), RSS at most {single['rss']:.2f} GiB")
        print(f"job, cluster: `run cluster.replicas={k} router={args.router}`: {cluster['wall']:.1f} s wall, "
              f"{cluster['cpu']:.1f} s CPU ({cluster['status']}, {cluster['finished']:,} finished), RSS at most "
              f"{cluster['rss']:.2f} GiB = {cluster['cpu'] / (k * single['cpu']):.2f}x the CPU of {k} single-replica "
              f"jobs{tries}; results: {cluster['run_dir']}")


if __name__ == "__main__":
    main()
