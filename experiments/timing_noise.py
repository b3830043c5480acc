"""How far a replay's metrics move when every step's duration carries a small independent error.

A measured step time is never exact (a CPU timer's run-to-run jitter is ~1 %, a GPU's less), and
on the virtual clock a step's duration decides which arrivals join the next batch, so errors do
not average out in TTFT and tail metrics. This runs the CLI job (`dataplane=sim`) with
`dataplane.time_noise=e` (each step x (1 + e N(0,1))) under K noise seeds and prints, per policy
and noise level, the largest relative difference between any two of the K replays: the floor
under which two real replays (or the sim against a real plane) cannot be expected to agree.
Usage: python experiments/timing_noise.py [--trace bursty] [--policies prefill_first,chunked]
                                          [--noise 0,0.002,0.01,0.03] [--seeds 4] [overrides ...]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import tempfile
from pathlib import Path

METRICS = {"TTFT p50": ("ttft", "p50"), "TTFT p99": ("ttft", "p99"), "TPOT p50": ("tpot", "p50"),
           "TPOT p99": ("tpot", "p99"), "E2E mean": ("e2e", "mean")}


def replay(policy: str, trace: str, noise: float, seed: int, overrides: list) -> dict:
    from policylab.apps.cli import main
    run_dir = Path(tempfile.mkdtemp(prefix="timing_noise_"))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(["run", f"policy={policy}", f"trace={trace}", "dataplane=sim", f"dataplane.time_noise={noise}",
                  f"dataplane.time_noise_seed={seed}", "logger=none", "plots=false", "progress=false",
                  f"hydra.run.dir={run_dir}", *overrides])
        except SystemExit as e:
            if e.code not in (0, None):
                raise
    summary = json.loads((run_dir / "summary.json").read_text())
    return {name: summary[a][b] for name, (a, b) in METRICS.items()}


def spread(runs: list) -> dict:
    """Largest |a/b - 1| over ordered pairs of replays, in %, per metric."""
    return {k: 100 * max(abs(a[k] / b[k] - 1) for a, b in itertools.permutations(runs, 2)) for k in METRICS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="bursty")
    ap.add_argument("--policies", default="prefill_first,chunked")
    ap.add_argument("--noise", default="0,0.002,0.01,0.03")
    ap.add_argument("--seeds", type=int, default=4)
    args, overrides = ap.parse_known_args()
    print(f"trace={args.trace} {' '.join(overrides)}: largest difference between {args.seeds} replays (%)")
    print("| policy | step-time noise | " + " | ".join(METRICS) + " |")
    print("|---|---|" + "---|" * len(METRICS))
    for policy in args.policies.split(","):
        for noise in map(float, args.noise.split(",")):
            runs = [replay(policy, args.trace, noise, seed, overrides) for seed in range(args.seeds)]
            row = spread(runs)
            print(f"| {policy} | {noise:.1%} | " + " | ".join(f"{row[k]:.1f}" for k in METRICS) + " |", flush=True)


if __name__ == "__main__":
    main()
