"""Scheduler cost per step at 256 running decodes: vLLM v1's own scheduler, the same scheduler
driven by a policylab policy (PolicyScheduler), and policylab's control plane (not a test).

All three hold 256 requests in decode and take `--steps` steps after warm-up:
- vLLM: `Scheduler.schedule()` + `update_from_output()` with fabricated model outputs (the
  bare loop of policylab.integrations.vllm.bare), block size 16, prefix caching off;
- PolicyScheduler: the same loop with the policy's view, plan validation and plan applied;
- policylab: `Engine.step()` on the sim plane minus the sim plane's own time (experiments/
  bench_engine.py (b)'s measure), same budgets.
Best of `--repeat` rounds each (the three measured side by side in every round) (CPU time of a shared machine varies; the ratio is the figure).
Usage (vLLM venv): python experiments/bench_vllm_scheduler.py [--policy chunked] [--steps 300] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]   # bench_engine; policylab from this checkout
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from bench_engine import timed_steps  # noqa: E402

from policylab.core.config import EngineConfig  # noqa: E402
from policylab.core.request import TraceRequest  # noqa: E402

RUNNING, PROMPT = 256, 64


def vllm_loop(scheduler_cls, steps: int) -> float:
    """µs per step of schedule() + update_from_output() with RUNNING decodes."""
    from policylab.integrations.vllm.bare import bare_scheduler, fake_output, vllm_requests
    cfg = EngineConfig(block_size=16, max_num_seqs=RUNNING, max_num_batched_tokens=RUNNING * PROMPT,
                       max_model_len=8192, enable_prefix_caching=False)
    out_len = steps + 200
    blocks = RUNNING * -(-(PROMPT + out_len) // cfg.block_size) + 1
    scheduler = bare_scheduler(scheduler_cls, cfg, blocks)
    for _, r in vllm_requests([TraceRequest(0.0, PROMPT, out_len) for _ in range(RUNNING)], cfg, 8192):
        scheduler.add_request(r)
    for _ in range(50):                      # admit and prefill everyone; then all decode
        out = scheduler.schedule()
        scheduler.update_from_output(out, fake_output(out, scheduler))
        if len(out.num_scheduled_tokens) == RUNNING and out.total_num_scheduled_tokens == RUNNING:
            break
    else:
        raise RuntimeError("never reached 256 running decodes")
    t0 = time.perf_counter()
    for _ in range(steps):
        out = scheduler.schedule()
        scheduler.update_from_output(out, fake_output(out, scheduler))
    total = time.perf_counter() - t0
    fake = _fake_output_cost(scheduler, out, steps)
    return (total - fake) / steps * 1e6


def _fake_output_cost(scheduler, out, steps: int) -> float:
    """Seconds the fabricated outputs took (they stand for the model runner: not scheduler time)."""
    from policylab.integrations.vllm.bare import fake_output
    t0 = time.perf_counter()
    for _ in range(steps):
        fake_output(out, scheduler)
    return time.perf_counter() - t0


def policylab_step(policy: str, steps: int) -> float:
    total, plane_time = timed_steps(policy, RUNNING, steps)
    return (total - plane_time) / steps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="chunked")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    from vllm.v1.core.sched.scheduler import Scheduler

    from policylab.integrations.vllm.scheduler import PolicyScheduler
    runs = []
    for _ in range(a.repeat):          # the three side by side in each round: a load change hits all
        runs.append((vllm_loop(Scheduler, a.steps), vllm_loop(PolicyScheduler.with_policy(a.policy), a.steps),
                     policylab_step(a.policy, a.steps)))
    vllm, adapted, ours = (min(r[i] for r in runs) for i in range(3))
    print(f"{RUNNING} running decodes, best of {a.repeat} x {a.steps} steps:")
    print(f"  vLLM Scheduler schedule()+update_from_output(): {vllm:8.0f} µs/step")
    print(f"  PolicyScheduler ({a.policy}) in vLLM:          {adapted:8.0f} µs/step ({adapted / vllm:.2f}x vLLM's own)")
    print(f"  policylab control plane ({a.policy}):           {ours:8.0f} µs/step")
    print(f"  ratio vLLM / policylab: {vllm / ours:.1f}x")


if __name__ == "__main__":
    main()
