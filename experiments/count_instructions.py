"""Control-plane work as CPU instructions counted by valgrind: a speed measure that noise cannot move.

On a shared machine wall-clock ratios of the same code drift by 15-50 % from minute to minute;
instruction counts repeat to ~0.2 %. Each workload runs twice under `valgrind --tool=callgrind`
(with and without the measured part) and the difference is divided by the units measured:
  steady  — instructions per engine step with N running decodes (sim data plane included);
  replay  — instructions per request of a K-request sim replay (bench_engine.py's trace).
Fewer instructions is not always less time (caches, branch prediction), so confirm a change
with bench_engine.py too. Needs valgrind (Debian package `valgrind`); slow: ~60x native.
Usage: python experiments/count_instructions.py [--running 256] [--steps 100] [--requests 300]
                                                [--against OTHER_CHECKOUT]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

WORKLOAD = r"""
import sys
sys.path.insert(0, "experiments")
import bench_engine as b
from policylab.config import EngineConfig
from policylab.engine import Engine
from policylab.request import TraceRequest
kind, n, units = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if kind == "steady":
    engine = Engine([TraceRequest(0.0, 64, 4000) for _ in range(n)], b.load_policy("prefill_first"),
                    b.sim_plane(), EngineConfig(max_num_seqs=n, max_num_batched_tokens=n * 64))
    for _ in range(8 + units):
        engine.step()
else:
    engine = Engine(b.make_trace(max(units, 1), 5.5, 1000, 200), b.load_policy("prefill_first"),
                    b.sim_plane(), EngineConfig())
    if units:
        assert engine.run().status == "complete"
"""


def instructions(checkout: str, kind: str, n: int, units: int) -> int:
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
           sys.executable, "-c", WORKLOAD, kind, str(n), str(units)]
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": checkout}
    out = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode or not found:
        sys.exit(f"valgrind run failed in {checkout}:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def per_unit(checkout: str, kind: str, n: int, units: int) -> float:
    return (instructions(checkout, kind, n, units) - instructions(checkout, kind, n, 0)) / units


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--running", type=int, default=256)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--against", help="another checkout (e.g. a git worktree of main) to compare with")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind not found: apt-get install valgrind")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for kind, n, units, unit in (("steady", args.running, args.steps, f"step with {args.running} decodes"),
                                 ("replay", 0, args.requests, "request of a sim replay")):
        mine = per_unit(here, kind, n, units)
        line = f"{kind}: {mine:,.0f} instructions per {unit}"
        if args.against:
            theirs = per_unit(os.path.abspath(args.against), kind, n, units)
            line += f"; {args.against}: {theirs:,.0f} (this/that {mine / theirs:.2f})"
        print(line)
