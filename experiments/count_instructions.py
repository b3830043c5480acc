"""Control-plane work as CPU instructions counted by valgrind: a speed measure that noise cannot move.

On a shared machine wall-clock ratios of the same code drift by 15-50 % from minute to minute;
instruction counts repeat to ~0.05 % (one BLAS thread, import-time objects frozen out of the
garbage collector). Each workload runs twice under `valgrind --tool=callgrind` (with and
without the measured part) and the difference is divided by the units measured:
  steady  — instructions per engine step with N running decodes (sim data plane included);
  replay  — instructions per request of a K-request sim replay (bench_engine.py's trace);
  job     — instructions per request of the replay inside the `run` job, as the CLI composes it
            (`chunked` on bench_scale.py's conversation trace of J requests; only the replay is
            counted: valgrind's collection is switched on around it).
The workloads are this checkout's bench_engine.py and bench_scale.py, so `--against` runs the
same workload on the other checkout's engine.
Fewer instructions is not always less time (caches, branch prediction), so confirm a change
with bench_engine.py too. Needs valgrind (Debian package `valgrind`); slow: ~60x native.
Usage: python experiments/count_instructions.py [--running 256] [--steps 100] [--requests 300]
                                                [--job 2000] [--against OTHER_CHECKOUT]
                                                (0 steps/requests/job: skip; --job is 0 unless given)
                                                [--cost-model roofline]        (the sim's; default shaped)
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

WORKLOAD = r"""
import gc, sys
sys.path.insert(0, sys.argv[4])   # this script's bench_engine.py: the same workload for every checkout
import bench_engine
from bench_engine import replay_engine, steady_engine
bench_engine.COST_MODEL = sys.argv[5]     # the sim's cost model (--cost-model)
gc.collect()
gc.freeze()        # import-time objects out of the collector's way: a full collection landing in
                   # one run and not the other would otherwise swamp a short measurement
kind, n, units = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if kind == "steady":
    engine = steady_engine("prefill_first", n, 4000)
    for _ in range(units):
        engine.step()
elif units:
    assert replay_engine(units, "prefill_first").run().status == "complete"
else:
    replay_engine(1, "prefill_first")
"""

JOB = r"""
import os, subprocess, sys
sys.path.insert(0, sys.argv[1])   # this script's bench_scale.py: the same job for every checkout
from bench_scale import run_args
trace, overrides = sys.argv[2], sys.argv[3:]
import policylab.apps.run as run_job
replay = run_job.replay


def counted_replay(*args, **kwargs):     # valgrind counts the replay only: not imports, Hydra or files
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True, capture_output=True)
    try:
        return replay(*args, **kwargs)
    finally:
        subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], check=True, capture_output=True)


run_job.replay = counted_replay
from policylab.apps.cli import main
try:
    main(run_args(trace, "none", ["plots=false", *overrides]))
except SystemExit as e:
    if e.code not in (0, None):
        raise
"""

COST_MODEL = "shaped"      # --cost-model


def collected(checkout: str, code: str, args: list, at_start: bool = True) -> int:
    """Instructions valgrind counts running `python -c code *args` on `checkout`'s policylab
    (`at_start=False`: only where the code switches the collection on)."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
           *([] if at_start else ["--instr-atstart=no"]), sys.executable, "-c", code, *args]
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": checkout,
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}   # no spinning BLAS threads in the count
    out = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode or not found:
        sys.exit(f"valgrind run failed in {checkout}:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def instructions(checkout: str, kind: str, n: int, units: int) -> int:
    return collected(checkout, WORKLOAD, [kind, str(n), str(units), os.path.dirname(os.path.abspath(__file__)),
                                          COST_MODEL])


def job_per_request(checkout: str, trace: str, requests: int, run_dir: str) -> float:
    """Instructions per request of the `run` job's replay (the JOB workload) in `checkout`."""
    with open(os.path.join(checkout, "configs", "dataplane", "sim.yaml")) as f:
        chooses = "cost_model" in f.read()      # (an older checkout: the roofline only)
    if not chooses and COST_MODEL != "roofline":
        sys.exit(f"{checkout} prices steps with the roofline only: measure both with --cost-model roofline")
    overrides = [f"hydra.run.dir={run_dir}", *([f"dataplane.cost_model={COST_MODEL}"] if chooses else [])]
    return collected(checkout, JOB, [os.path.dirname(os.path.abspath(__file__)), trace, *overrides],
                     at_start=False) / requests


def per_unit(checkout: str, kind: str, n: int, units: int) -> float:
    work = instructions(checkout, kind, n, units) - instructions(checkout, kind, n, 0)
    if work <= 0:
        sys.exit(f"{kind}: {units} units measured no work above the baseline; measure more units")
    return work / units


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--running", type=int, default=256)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--job", type=int, default=0, help="requests of the run-job workload (0: skip)")
    ap.add_argument("--trace-dir", default="/tmp", help="where the job's trace is written once (bench_scale.py's)")
    ap.add_argument("--against", help="another checkout (e.g. a git worktree of main) to compare with")
    ap.add_argument("--cost-model", default="shaped", help="the sim's cost model (shaped | roofline | kernel)")
    args = ap.parse_args()
    COST_MODEL = args.cost_model
    if shutil.which("valgrind") is None:
        sys.exit("valgrind not found: apt-get install valgrind")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for kind, n, units, unit in (("steady", args.running, args.steps, f"step with {args.running} decodes"),
                                 ("replay", 0, args.requests, "request of a sim replay")):
        if not units:                  # --steps 0 / --requests 0: skip that workload
            continue
        mine = per_unit(here, kind, n, units)
        line = f"{kind}: {mine:,.0f} instructions per {unit}"
        if args.against:
            theirs = per_unit(os.path.abspath(args.against), kind, n, units)
            line += f"; {args.against}: {theirs:,.0f} (this/that {mine / theirs:.2f})"
        print(line)
    if args.job:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from pathlib import Path
        import tempfile
        from bench_scale import trace_file
        trace = str(trace_file(args.job, Path(args.trace_dir)))
        with tempfile.TemporaryDirectory() as tmp:
            mine = job_per_request(here, trace, args.job, os.path.join(tmp, "this"))
            line = f"job: {mine:,.0f} instructions per request of the run job's replay ({args.job} requests, chunked)"
            if args.against:
                theirs = job_per_request(os.path.abspath(args.against), trace, args.job, os.path.join(tmp, "that"))
                line += f"; {args.against}: {theirs:,.0f} (this/that {mine / theirs:.2f})"
        print(line)
