"""Control-plane cost of every shipped policy with 256 running decodes (bench_engine.py's (b)),
in one run, in CPU time.

Each policy steps bench_engine's steady engine (256 requests decoding, default budgets) for
--steps steps; its control plane is the process's CPU time minus the sim data plane's. CPU
time rather than wall time: on a shared machine a process waiting for a core does not count,
so policies measured in one run compare (the target is 150 µs a step). --rounds repeats the
sweep and reports each policy's min and median. To compare checkouts, run this file with
each on PYTHONPATH from that checkout's root (it uses only bench_engine.steady_engine).

--nano-vllm PATH (a checkout of github.com/GeeeekExplorer/nano-vllm) also times nano-vLLM's
`Scheduler` in the same process on the same box: its `schedule()` + `postprocess()` with the
same number of running decodes (its own block manager and sequences, no model), and reports
each policy's cost as a ratio to it. Only its scheduler, block manager, sequence and sampling
modules are imported; its package `__init__` (the model runner: torch, transformers) is skipped
and its `Config` (which reads a model directory) is replaced by the fields the scheduler reads.
Usage: python experiments/bench_policies.py [--steps 1000] [--rounds 3] [--nano-vllm PATH]
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
import types
from dataclasses import dataclass
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


@dataclass
class NanoConfig:
    """The fields of nano-vLLM's `Config` that its `Scheduler` reads."""
    max_num_seqs: int
    max_num_batched_tokens: int
    eos: int = -1
    kvcache_block_size: int = 256          # nano-vLLM's default (a multiple of 256)
    num_kvcache_blocks: int = 0


def load_nano_vllm(path: str) -> types.SimpleNamespace:
    """nano-vLLM's Scheduler, Sequence and SamplingParams from a checkout, without its package
    `__init__` (the model runner) and with `NanoConfig` for its `nanovllm.config`."""
    root = Path(path).resolve() / "nanovllm"
    if not (root / "engine" / "scheduler.py").is_file():
        sys.exit(f"--nano-vllm {path}: no nanovllm/engine/scheduler.py there (a checkout of nano-vllm expected)")
    package = types.ModuleType("nanovllm")
    package.__path__ = [str(root)]
    config = types.ModuleType("nanovllm.config")
    config.Config = NanoConfig
    sys.modules.update({"nanovllm": package, "nanovllm.config": config})
    return types.SimpleNamespace(
        Scheduler=importlib.import_module("nanovllm.engine.scheduler").Scheduler,
        Sequence=importlib.import_module("nanovllm.engine.sequence").Sequence,
        SamplingParams=importlib.import_module("nanovllm.sampling_params").SamplingParams)


def nano_vllm_cpu_per_step(nano: types.SimpleNamespace, running: int, steps: int) -> float:
    """CPU seconds a step of nano-vLLM's scheduler with `running` decodes: `schedule()` and
    `postprocess()` of the sampled tokens, as its `LLMEngine.step` calls them (no model run)."""
    cfg = NanoConfig(max_num_seqs=running, max_num_batched_tokens=running * 64)   # bench_engine's budgets
    blocks_each = -(-(64 + steps + 100) // cfg.kvcache_block_size)
    cfg.num_kvcache_blocks = running * blocks_each
    nano.Sequence.block_size = cfg.kvcache_block_size     # as its LLMEngine sets it
    scheduler = nano.Scheduler(cfg)
    for i in range(running):       # 64-token prompts, steps + 100 tokens to generate (bench_engine's steady state)
        scheduler.add(nano.Sequence([i % 1000 + 1] * 64, nano.SamplingParams(max_tokens=steps + 100, ignore_eos=True)))
    seqs, is_prefill = scheduler.schedule()
    assert is_prefill and len(seqs) == running, "nano-vLLM did not prefill every sequence in one step"
    scheduler.postprocess(seqs, [7] * len(seqs), is_prefill)
    tokens = [7] * running
    t0 = time.process_time()
    for _ in range(steps):
        seqs, is_prefill = scheduler.schedule()
        scheduler.postprocess(seqs, tokens, is_prefill)
    cpu = time.process_time() - t0
    assert not is_prefill and len(seqs) == running, "nano-vLLM's steady state is not every sequence decoding"
    return cpu / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--running", type=int, default=256)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--nano-vllm", metavar="PATH", help="a nano-vllm checkout: time its Scheduler too, report ratios")
    args = ap.parse_args()
    policies = args.policies.split(",")
    nano = load_nano_vllm(args.nano_vllm) if args.nano_vllm else None
    costs = {p: [] for p in policies}
    nano_costs = []
    for _ in range(args.rounds):         # (interleaved: a slow minute of the machine hits every one)
        if nano is not None:
            nano_costs.append(nano_vllm_cpu_per_step(nano, args.running, args.steps) * 1e6)
        for p in policies:
            costs[p].append(control_cpu_per_step(p, args.running, args.steps) * 1e6)
    title = f"({args.rounds} rounds, {args.running} running decodes, CPU time)"
    if nano is None:
        print(f"| policy | µs/step, min | median {title} |")
        print("|---|---|---|")
        for p in policies:
            print(f"| {p} | {min(costs[p]):.0f} | {statistics.median(costs[p]):.0f} |")
        return
    ref = statistics.median(nano_costs)
    print(f"| policy | µs/step, min | median | median / nano-vLLM's {title} |")
    print("|---|---|---|---|")
    print(f"| nano-vLLM Scheduler | {min(nano_costs):.0f} | {ref:.0f} | 1.00 |")
    for p in policies:
        median = statistics.median(costs[p])
        print(f"| {p} | {min(costs[p]):.0f} | {median:.0f} | {median / ref:.2f} |")


if __name__ == "__main__":
    main()
