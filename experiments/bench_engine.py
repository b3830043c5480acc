"""Control-plane speed of the engine (not a test; numbers go in closing notes).

(a) sim-mode replay of a generated 20,000-request trace (Poisson 5.5 req/s, prompts
    mean ~1,000, outputs mean ~200) with prefill_first — wall seconds (target ≤ 20 s);
(b) control-plane time per step with 256 running decodes (engine + policy + validation,
    data plane excluded) — µs per step (target ≤ 150 µs).
Usage: python experiments/bench_engine.py [--requests 20000] [--policy prefill_first] [--repeat 1]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import yaml

from policylab.core.config import DataplaneConfig, EngineConfig, HardwareConfig, ModelConfig
from policylab.dataplane.sim import SimDataPlane
from policylab.core.engine import Engine
from policylab.core.request import TraceRequest
from policylab.testing.loader import load_policy as load_policy_spec


def lognormal_lengths(rng, mean, sigma, n, cap):
    return np.clip(rng.lognormal(np.log(mean) - sigma ** 2 / 2, sigma, n), 1, cap).astype(int)


def make_trace(n, rate, prompt_mean, output_mean, seed=0):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    prompts = lognormal_lengths(rng, prompt_mean, 0.8, n, 6000)
    outputs = lognormal_lengths(rng, output_mean, 0.8, n, 2000)
    return [TraceRequest(float(a), int(p), int(o)) for a, p, o in zip(arrivals, prompts, outputs)]


def load_policy(name):
    return load_policy_spec(f"configs/policy/{name}.yaml")      # resolves ${fairness.*} / ${slo.*} too


def sim_plane():
    model = ModelConfig(**yaml.safe_load(open("configs/model/llama3-8b.yaml")))
    return SimDataPlane(model, HardwareConfig(), DataplaneConfig(kind="sim"))


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


def bench_decode_step(policy, running=256, steps=1000):
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
    total = time.perf_counter() - t0
    control = total - plane_time
    print(f"(b) {policy}: {control / steps * 1e6:.0f} µs/step control plane with {running} running "
          f"decodes (sim data plane excluded: {plane_time / steps * 1e6:.0f} µs/step, control/sim "
          f"{control / plane_time:.1f}x: the steadier number under load)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--policy", default="prefill_first")
    ap.add_argument("--repeat", type=int, default=1,
                    help="replays of (a), each from a fresh engine: on a shared, noisy machine one "
                         "number says little; the min is the least disturbed, the median the typical")
    args = ap.parse_args()
    bench_decode_step(args.policy)
    walls = sorted(bench_replay(args.requests, args.policy) for _ in range(args.repeat))
    if args.repeat > 1:
        print(f"(a) {args.repeat} replays: min {walls[0]:.2f} s, median {statistics.median(walls):.2f} s, "
              f"max {walls[-1]:.2f} s wall")
