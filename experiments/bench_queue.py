"""Control-plane cost per step against the waiting queue's length, every policy, under overload.

The trace is conversation-shaped (the project's generator, Poisson, prompts lognormal mean
1,150 / p90 2,300, outputs mean 210 / p90 450) with 19,366 requests at 21.5 req/s: the
Azure 2023 conversation trace's size and shape at 4x its rate, which a simulated
Llama-3-8B on an H100 cannot keep up with, so the waiting queue grows step after step.
Each policy replays the first --steps steps (default engine budgets, KV from the sim plane);
a step's control-plane time is its CPU time minus the sim data plane's (CPU time: on a
shared machine, time spent waiting for a core does not count). Reported per
policy: µs per step in bands of the waiting length at the step's start (mean length in
brackets). An engine whose per-step work follows the queue shows rising bands.
Usage: python experiments/bench_queue.py [--steps 12000] [--policies chunked,sjf] [--trace-dir /tmp]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.core.engine import Engine
from policylab.dataplane.sim import SimDataPlane
from policylab.testing.loader import CONFIG_DIR, load_policy
from policylab.traces import load_trace
from policylab.traces.config import TraceConfig

POLICIES = ("prefill_first", "decode_first", "chunked", "slo_aware", "fairness", "priority", "sjf")
BANDS = (0, 1, 1000, 3000, 6000, 10 ** 9)
GENERATE = ["--kind", "poisson", "-n", "19366", "--rate", "21.5", "--seed", "0",
            "--prompt-len", "lognormal:mean=1150,p90=2300,max=7000",
            "--output-len", "lognormal:mean=210,p90=450,max=1000"]


def trace(trace_dir: Path) -> list:
    path = trace_dir / "conversation_19366_4x.jsonl"
    if not path.exists():
        subprocess.run([sys.executable, "-m", "policylab", "trace", "generate", "-o", str(path), *GENERATE],
                       check=True)
    return load_trace(TraceConfig(name="file", path=str(path)))


def sim_plane() -> SimDataPlane:
    model = ModelConfig(**yaml.safe_load((CONFIG_DIR / "model" / "llama3-8b.yaml").read_text()))
    return SimDataPlane(model, HardwareConfig(), DataplaneConfig(kind="sim"))


def measure(policy: str, requests: list, steps: int) -> tuple:
    """(waiting length, control-plane seconds) of each of the first `steps` steps."""
    plane = sim_plane()
    spec = str(CONFIG_DIR / "policy" / f"{policy}.yaml")
    if policy == "prefill_first":        # the published figures predate prefill_first's watermark
        spec = {**yaml.safe_load(open(spec)), "watermark": 0.0}
    engine = Engine(requests, load_policy(spec), plane,
                    EngineConfig(max_model_len=8192))
    execute, plane_time = plane.execute, [0.0]

    def timed_execute(batch):
        t = time.process_time()
        out = execute(batch)
        plane_time[0] += time.process_time() - t
        return out
    plane.execute = timed_execute
    waiting, control = np.zeros(steps), np.zeros(steps)
    for i in range(steps):
        if engine.num_done >= len(requests):
            return waiting[:i], control[:i]
        waiting[i] = len(engine._waiting)
        before, plane_time[0] = time.process_time(), 0.0
        engine.step()
        control[i] = time.process_time() - before - plane_time[0]
    return waiting, control


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12000)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--trace-dir", type=Path, default=Path("/tmp"))
    args = ap.parse_args()
    requests = trace(args.trace_dir)
    bands = [f"{lo}-{hi - 1}" if hi < 10 ** 9 else f"{lo}+" for lo, hi in zip(BANDS, BANDS[1:])]
    print("| policy | " + " | ".join(f"waiting {b}" for b in bands) + " |")
    print("|---" * (len(bands) + 1) + "|")
    for policy in args.policies.split(","):
        waiting, control = measure(policy, requests, args.steps)
        cells = []
        for lo, hi in zip(BANDS, BANDS[1:]):
            band = (waiting >= lo) & (waiting < hi)
            cells.append(f"{control[band].mean() * 1e6:,.0f} µs [{waiting[band].mean():,.0f}]"
                         if band.any() else "—")
        print(f"| {policy} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
