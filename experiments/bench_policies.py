"""Control-plane cost of every shipped policy with 256 running decodes (bench_engine.py's (b)),
in one run, in CPU time.

Each policy steps bench_engine's steady engine (256 requests decoding, default budgets) for
--steps steps; its control plane is the process's CPU time minus the sim data plane's. CPU
time rather than wall time: on a shared machine a process waiting for a core does not count,
so policies measured in one run compare (the target is 150 µs a step). --rounds repeats the
sweep and reports each policy's min and median. To compare checkouts, run this file with
each on PYTHONPATH from that checkout's root (it uses only bench_engine.steady_engine).
Usage: python experiments/bench_policies.py [--steps 1000] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd() / "experiments"))
from bench_engine import steady_engine  # noqa: E402  (the checkout's own, from its root)

POLICIES = ("prefill_first", "decode_first", "chunked", "slo_aware", "fairness", "priority", "sjf", "lpm", "dfs_weight")


def control_cpu_per_step(policy: str, running: int, steps: int) -> float:
    engine = steady_engine(policy, running, steps + 100)
    plane = engine.dataplane
    execute, plane_cpu = plane.execute, [0.0]

    def timed_execute(batch):
        t = time.process_time()
        out = execute(batch)
        plane_cpu[0] += time.process_time() - t
        return out
    plane.execute = timed_execute
    t0 = time.process_time()
    for _ in range(steps):
        engine.step()
    return (time.process_time() - t0 - plane_cpu[0]) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--running", type=int, default=256)
    ap.add_argument("--policies", default=",".join(POLICIES))
    args = ap.parse_args()
    policies = args.policies.split(",")
    costs = {p: [] for p in policies}
    for _ in range(args.rounds):
        for p in policies:
            costs[p].append(control_cpu_per_step(p, args.running, args.steps) * 1e6)
    print(f"| policy | µs/step, min | median ({args.rounds} rounds, {args.running} running decodes, CPU time) |")
    print("|---|---|---|")
    for p in policies:
        print(f"| {p} | {min(costs[p]):.0f} | {statistics.median(costs[p]):.0f} |")


if __name__ == "__main__":
    main()
