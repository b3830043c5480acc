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

--instructions counts instructions instead (valgrind's callgrind; Debian package `valgrind`):
a figure the machine's load cannot move. Each policy steps an engine whose data plane hands
back the results an identical engine's sim plane computed, so only the control plane runs
(nano-vLLM's scheduler runs no plane either); all of them step in one valgrind process, each
counted only around its steps, less the cost of switching the count on and off.
The default list is every shipped policy (configs/policy/*.yaml).
Usage: python experiments/bench_policies.py [--steps 1000] [--rounds 3] [--nano-vllm PATH]
                                            [--instructions [--steps 200]] [--policies a,b]
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path.cwd() / "experiments"))
from bench_engine import steady_engine  # noqa: E402  (the checkout's own, from its root)

ORDER = ("prefill_first", "decode_first", "chunked", "slo_aware", "fairness", "priority", "sjf", "lpm", "dfs_weight",
         "plas", "vllm_v1", "spec_adaptive")      # the table's order; any other shipped policy follows
SHIPPED = sorted(path.stem for path in (Path.cwd() / "configs" / "policy").glob("*.yaml"))
POLICIES = tuple(p for p in ORDER if p in SHIPPED) + tuple(p for p in SHIPPED if p not in ORDER)
NANO = "nano-vLLM Scheduler"


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


def nano_vllm_steps(nano: types.SimpleNamespace, running: int, steps: int) -> tuple:
    """(step, check): a step of nano-vLLM's scheduler with `running` decodes, as its `LLMEngine.step`
    calls it (no model run): `schedule()` and `postprocess()` of the sampled tokens, for `steps`
    steps; and a check, after them, that one more step still decodes every sequence."""
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

    def step():
        seqs, is_prefill = scheduler.schedule()
        scheduler.postprocess(seqs, tokens, is_prefill)

    def check() -> None:
        seqs, is_prefill = scheduler.schedule()
        if is_prefill or len(seqs) != running:
            sys.exit("nano-vLLM's steady state is not every sequence decoding")
    return step, check


def nano_vllm_cpu_per_step(nano: types.SimpleNamespace, running: int, steps: int) -> float:
    """CPU seconds a step of nano-vLLM's scheduler with `running` decodes."""
    step, check = nano_vllm_steps(nano, running, steps)
    t0 = time.process_time()
    for _ in range(steps):
        step()
    cpu = time.process_time() - t0
    check()
    return cpu / steps


def replayed_steps(policy: str, running: int, steps: int) -> tuple:
    """(step, check): a step of bench_engine's steady engine under `policy` whose data plane hands
    back the results an identical engine's sim plane computed, step by step (the control plane
    alone runs), and a check that `steps` of them left it where the computing engine ended."""
    computing = steady_engine(policy, running, steps + 100)
    execute, results = computing.dataplane.execute, []
    computing.dataplane.execute = lambda batch: results.append(execute(batch)) or results[-1]
    for _ in range(steps):
        computing.step()
    engine = steady_engine(policy, running, steps + 100)
    recorded = iter(results)
    engine.dataplane.execute = lambda batch: next(recorded)

    def check() -> None:
        outputs = [[len(r.output_ids) for r in e.requests] for e in (engine, computing)]
        if engine.clock.now != computing.clock.now or outputs[0] != outputs[1]:
            sys.exit(f"{policy}: the engine fed recorded results did not step as the one that computed them")
    return engine.step, check


COUNTED = r"""
import gc, os, subprocess, sys
sys.path.insert(0, sys.argv[1])
import bench_policies as bench
units, running, steps = sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])


def callgrind(*args):
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True, capture_output=True)


for unit in units:
    if unit == bench.NANO:
        step, check = bench.nano_vllm_steps(bench.load_nano_vllm(sys.argv[5]), running, steps)
    else:
        step, check = bench.replayed_steps(unit, running, steps)
    gc.collect()
    gc.freeze()
    for n in (0, steps):             # the switches' own count, then the steps' (each dump starts from 0)
        callgrind("-i", "on")
        for _ in range(n):
            step()
        callgrind("-i", "off")
        callgrind("-d")
    check()
"""


def instructions_per_step(units: list, running: int, steps: int, nano_path: str | None) -> dict:
    """Instructions per step of each unit (a policy's control plane, or NANO), counted by callgrind
    in one process: each unit's dump of `steps` steps less its dump of none."""
    if shutil.which("valgrind") is None:
        sys.exit("--instructions needs valgrind (Debian package `valgrind`)")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={tmp}/out",
               sys.executable, "-c", COUNTED, str(Path(__file__).resolve().parent), ",".join(units), str(running),
               str(steps), os.path.abspath(nano_path) if nano_path else ""]
        env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"the valgrind run failed:\n{done.stderr[-3000:]}")
        dumps = sorted(Path(tmp).glob("out.*"), key=lambda path: int(path.suffix[1:]))
        counts = [int(re.search(r"^totals: (\d+)", path.read_text(), re.M).group(1)) for path in dumps]
    if len(counts) != 2 * len(units):
        sys.exit(f"expected {2 * len(units)} callgrind dumps, found {len(counts)}")
    return {unit: (counts[2 * i + 1] - counts[2 * i]) / steps for i, unit in enumerate(units)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=None, help="steps per measurement (1000; --instructions: 200)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--running", type=int, default=256)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--nano-vllm", metavar="PATH", help="a nano-vllm checkout: time its Scheduler too, report ratios")
    ap.add_argument("--instructions", action="store_true", help="count instructions under valgrind instead of timing")
    args = ap.parse_args()
    policies = args.policies.split(",")
    if args.instructions:
        steps = args.steps or 200
        units = ([NANO] if args.nano_vllm else []) + policies
        counts = instructions_per_step(units, args.running, steps, args.nano_vllm)
        ref = counts.get(NANO)
        print(f"| policy | instructions per step ({steps} steps, {args.running} running decodes) |"
              + (" / nano-vLLM's |" if ref else ""))
        print("|---|---|" + ("---|" if ref else ""))
        for unit in units:
            print(f"| {unit} | {counts[unit]:,.0f} |" + (f" {counts[unit] / ref:.2f} |" if ref else ""))
        return
    steps = args.steps or 1000
    nano = load_nano_vllm(args.nano_vllm) if args.nano_vllm else None
    costs = {p: [] for p in policies}
    nano_costs = []
    for _ in range(args.rounds):         # (interleaved: a slow minute of the machine hits every one)
        if nano is not None:
            nano_costs.append(nano_vllm_cpu_per_step(nano, args.running, steps) * 1e6)
        for p in policies:
            costs[p].append(control_cpu_per_step(p, args.running, steps) * 1e6)
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
    print(f"| {NANO} | {min(nano_costs):.0f} | {ref:.0f} | 1.00 |")
    for p in policies:
        median = statistics.median(costs[p])
        print(f"| {p} | {min(costs[p]):.0f} | {median:.0f} | {median / ref:.2f} |")


if __name__ == "__main__":
    main()
