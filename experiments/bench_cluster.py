"""Speed of the cluster loop (not a test; numbers go in closing notes).

N replicas of the sim plane (Llama-3-8B shape on an H100), `prefill_first` on each, a router
over them, on a conversation-shaped trace from the project's generator (Poisson arrivals;
prompts lognormal mean 1,150 / p90 2,400; outputs mean 210 / p90 450: Azure's conversation
trace's means) at N x 5.5 req/s. Prints the cluster's wall and CPU seconds (target ≤ 60 s for 8
replicas and 150,000 requests) beside one replica replaying alone the share round_robin gives
replica 0 (every N-th request, ~5.5 req/s: the same steps it runs in the cluster), and the ratio
cluster / (N x single) of CPU seconds: what the cluster loop adds over N separate replays.

Measured twice, in one process:
  direct — `Cluster.run()` against `Engine.run()` (the loops alone, every result kept in memory);
  job    — the `run` job a user starts, `policylab.apps.cli.main(["run", ...])` in process, on the
           same traces written to parquet (--trace-dir): trace loading, building the replicas, the
           replay with its results stream (requests.parquet written and forgotten as it goes),
           steps.parquet, summary.json, and `logger` (none here; --logger wandb: offline W&B).
The job's engine settings are the direct run's (engine.max_model_len=8192), so both replay the
same decisions. CPU seconds are this process's (getrusage): on a shared box they are the steadier
figure (wall exceeds CPU when other work holds the cores).
Usage: python experiments/bench_cluster.py [--requests 150000] [--replicas 8] [--router round_robin]
                                           [--skip direct|job] [--trace-dir /tmp] [--logger none]
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import io
import resource
import time
from pathlib import Path

import yaml

from bench_scale import RssSampler
from policylab.cluster import Cluster, Replica
from policylab.core.config import DataplaneConfig, EngineConfig, HardwareConfig, ModelConfig
from policylab.core.engine import Engine
from policylab.dataplane.sim import SimDataPlane
from policylab.testing.loader import load_policy
from policylab.traces.arrivals import ArrivalProcess
from policylab.traces.generate import ClientSpec, generate_trace
from policylab.traces.lengths import LengthDist

RATE_PER_REPLICA = 5.5


def conversation_trace(n: int, rate: float, seed: int = 0) -> list:
    client = ClientSpec("chat", ArrivalProcess("poisson", rate=rate),
                        LengthDist("lognormal", mean=1150, at=2400, max=6000),
                        LengthDist("lognormal", mean=210, at=450, max=2000))
    return generate_trace([client], n, seed)


def engine(trace: list, policy: str) -> Engine:
    model = ModelConfig(**yaml.safe_load(open("configs/model/llama3-8b.yaml")))
    plane = SimDataPlane(model, HardwareConfig(), DataplaneConfig(kind="sim"))
    return Engine(trace, load_policy(f"configs/policy/{policy}.yaml"), plane, EngineConfig(), prefix_block_tokens=512)


def router(name: str):
    """configs/router/NAME.yaml's router, seed 0."""
    spec = yaml.safe_load(open(f"configs/router/{name}.yaml"))
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
    overrides = ["run", f"policy={args.policy}", "trace=file", f"trace.path={trace_path}", "dataplane=sim",
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
    import json
    return json.loads((run_dir / "summary.json").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=150_000)
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--policy", default="prefill_first")
    p.add_argument("--router", default="round_robin")
    p.add_argument("--skip", choices=["direct", "job"], default=None)
    p.add_argument("--trace-dir", type=Path, default=Path("/tmp"))
    p.add_argument("--logger", default="none", help="none (default) or wandb (offline)")
    args = p.parse_args()
    n, k = args.requests, args.replicas
    trace = conversation_trace(n, k * RATE_PER_REPLICA)
    share = trace[0::k]
    lines = []
    if args.skip != "direct":
        engine(share[:50], args.policy).run()         # one-time costs of the process (first numpy calls, ...)
        single_s, single_cpu, single = timed(lambda: engine(share, args.policy).run())
        single_steps, single_status = len(single.steps["clock"]), single.status
        del single
        cluster = Cluster(trace, [Replica(i, "colocated", "h100", engine(trace, args.policy)) for i in range(k)],
                          router(args.router))
        cluster_s, cluster_cpu, result = timed(cluster.run)
        steps, status = len(result.steps["clock"]), result.status
        del cluster, result
        lines += [f"direct, single replica: {len(share):,} requests (every {k}th) at ~{RATE_PER_REPLICA} req/s: "
                  f"{single_s:.1f} s wall, {single_cpu:.1f} s CPU ({single_steps:,} steps, {single_status})",
                  f"direct, cluster: {k} replicas, {args.router}, {n:,} requests at {k * RATE_PER_REPLICA:g} req/s: "
                  f"{cluster_s:.1f} s wall, {cluster_cpu:.1f} s CPU ({steps:,} steps, "
                  f"{1e6 * cluster_cpu / max(steps, 1):.1f} µs CPU/step, {status}) = "
                  f"{cluster_cpu / (k * single_cpu):.2f}x the CPU of {k} single-replica replays (target ≤ 60 s)"]
        print(lines[-2], lines[-1], sep="\n", flush=True)
    if args.skip != "job":
        from policylab.traces.parquet import write_parquet
        paths = {}
        for name, t in (("cluster", trace), ("share", share)):
            paths[name] = args.trace_dir / f"bench_cluster_{name}_{n}_{k}.parquet"
            if not paths[name].exists():
                write_parquet(paths[name], t)
        del trace, share
        run_dir = args.trace_dir / f"bench_cluster_runs_{n}_{k}"
        job(paths["share"], run_dir / "warm_up", args, k, "trace.max_requests=50")     # imports, first compose
        single_s, single_cpu, single = timed(lambda: job(paths["share"], run_dir / "single", args, 1))
        sampler = RssSampler()           # the job's memory (the peak of the process includes the direct runs)
        sampler.start()
        cluster_s, cluster_cpu, summary = timed(lambda: job(paths["cluster"], run_dir / "cluster", args, k))
        sampler.stop.set()
        rss = max(sampler.samples, default=0) / 2**30
        lines += [f"job, single replica: `run` on the share: {single_s:.1f} s wall, {single_cpu:.1f} s CPU "
                  f"({single['status']})",
                  f"job, cluster: `run cluster.replicas={k} router={args.router}`: {cluster_s:.1f} s wall, "
                  f"{cluster_cpu:.1f} s CPU ({summary['status']}, {summary['counts']['finished']:,} finished) = "
                  f"{cluster_cpu / (k * single_cpu):.2f}x the CPU of {k} single-replica jobs; "
                  f"RSS at most {rss:.2f} GiB (sampled each second); results: {run_dir}"]
        print(lines[-2], lines[-1], sep="\n", flush=True)


if __name__ == "__main__":
    main()
