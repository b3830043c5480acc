"""Speed of the cluster loop (not a test; numbers go in closing notes).

N replicas of the sim plane (Llama-3-8B shape on an H100), `prefill_first` on each, a router
over them, on a conversation-shaped trace from the project's generator (Poisson arrivals;
prompts lognormal mean 1,150 / p90 2,400; outputs mean 210 / p90 450: Azure's conversation
trace's means) at N x 5.5 req/s. Prints the cluster's wall seconds (target ≤ 60 s for 8 replicas
and 150,000 requests) beside one replica replaying alone the share round_robin gives replica 0
(every N-th request, ~5.5 req/s: the same steps it runs in the cluster), and the ratio
cluster / (N x single): what the cluster loop adds over N separate replays.
Usage: python experiments/bench_cluster.py [--requests 150000] [--replicas 8] [--router round_robin]
"""
from __future__ import annotations

import argparse
import importlib
import time

import yaml

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


def timed(run) -> tuple:
    """(wall seconds, CPU seconds of this process, result): on a shared box the CPU time is the
    steadier figure."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = run()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=150_000)
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--policy", default="prefill_first")
    p.add_argument("--router", default="round_robin")
    args = p.parse_args()
    n, k = args.requests, args.replicas
    trace = conversation_trace(n, k * RATE_PER_REPLICA)
    share = trace[0::k]
    single_s, single_cpu, single = timed(lambda: engine(share, args.policy).run())
    cluster = Cluster(trace, [Replica(i, "colocated", "h100", engine(trace, args.policy)) for i in range(k)],
                      router(args.router))
    cluster_s, cluster_cpu, result = timed(cluster.run)
    steps = len(result.steps["clock"])
    print(f"single replica: {len(share):,} requests (every {k}th) at ~{RATE_PER_REPLICA} req/s: {single_s:.1f} s "
          f"wall, {single_cpu:.1f} s CPU ({len(single.steps['clock']):,} steps, {single.status})")
    print(f"cluster: {k} replicas, {args.router}, {n:,} requests at {k * RATE_PER_REPLICA:g} req/s: "
          f"{cluster_s:.1f} s wall, {cluster_cpu:.1f} s CPU ({steps:,} steps, {1e6 * cluster_cpu / max(steps, 1):.1f} "
          f"µs CPU/step, {result.status}) = {cluster_cpu / (k * single_cpu):.2f}x the CPU of {k} single-replica "
          "replays (target ≤ 60 s)")


if __name__ == "__main__":
    main()
