"""Scale of one replay: a conversation-shaped trace of N requests through the CLI job, in process.

The trace is the project's generator's Poisson trace at ~22 req/s with conversation lengths
(prompts lognormal mean 1,150 / p90 2,300, outputs mean 210 / p90 450: the Azure 2023
conversation trace's shape at 4x its rate), written once to --trace-dir. The replay is
`policylab.apps.cli.main(["run", ...])` with `chunked`, `dataplane=sim` and the default
logger (W&B offline), exactly a user's job. Reported: wall seconds, peak RSS (getrusage) and
the RSS sampled every second (min/median/max of the samples in each quarter of the run), so
time linear and memory flat in N show at a glance. Targets for 1,000,000 requests on the
2-core box: <= 10 minutes, <= 4 GB peak RSS.
Usage: python experiments/bench_scale.py --requests 100000 [--trace-dir /tmp] [--out DIR] [OVERRIDE ...]
"""
from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

GENERATE = ["--kind", "poisson", "--rate", "22", "--seed", "0",
            "--prompt-len", "lognormal:mean=1150,p90=2300,max=7000",
            "--output-len", "lognormal:mean=210,p90=450,max=1000"]


def trace_file(n: int, trace_dir: Path) -> Path:
    path = trace_dir / f"conversation_{n}.parquet"
    if not path.exists():        # a separate process: its memory is not the replay's
        subprocess.run([sys.executable, "-m", "policylab", "trace", "generate", "-n", str(n),
                        "-o", str(path), *GENERATE], check=True)
    return path


def run_args(trace, logger: str, overrides: list) -> list:
    """The `run` job this benchmark times: `chunked` on the trace, the sim, no progress bar."""
    return ["run", "policy=chunked", "trace=file", f"trace.path={trace}", "dataplane=sim", f"logger={logger}",
            "progress=false", *overrides]


class RssSampler(threading.Thread):
    """Resident set size (bytes) once a second, from /proc/self/statm."""

    def __init__(self):
        super().__init__(daemon=True)
        self.samples, self.stop = [], threading.Event()
        self.page = resource.getpagesize()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            with open("/proc/self/statm") as f:
                self.samples.append(int(f.read().split()[1]) * self.page)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--trace-dir", type=Path, default=Path("/tmp"))
    ap.add_argument("--out", type=Path, default=None, help="run directory (default: under --trace-dir)")
    ap.add_argument("--logger", default="wandb", help="wandb (default, offline) or none")
    ap.add_argument("overrides", nargs="*", help="more run overrides, e.g. dataplane.cost_model=roofline "
                                                 "(the same simulated run as a checkout whose default it was)")
    args = ap.parse_args()
    path = trace_file(args.requests, args.trace_dir)
    out = args.out or args.trace_dir / f"scale_run_{args.requests}"
    from policylab.apps.cli import main as cli
    sampler = RssSampler()
    sampler.start()
    t0, cpu0 = time.perf_counter(), sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    try:
        cli(run_args(path, args.logger, [f"hydra.run.dir={out}", *args.overrides]))
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    wall = time.perf_counter() - t0
    sampler.stop.set()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    peak, cpu = usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime - cpu0
    s = sampler.samples or [0]
    quarters = [sorted(s[i * len(s) // 4:max((i + 1) * len(s) // 4, i * len(s) // 4 + 1)]) for i in range(4)]
    spread = "  ".join(f"q{i + 1} {q[0] / 2**30:.2f}/{q[len(q) // 2] / 2**30:.2f}/{q[-1] / 2**30:.2f}"
                       for i, q in enumerate(quarters) if q)
    print(f"{args.requests} requests, chunked, sim: {wall:.1f} s wall ({wall / 60:.1f} min), {cpu:.1f} s CPU "
          "(wall exceeds CPU when the shared machine is busy), "
          f"peak RSS {peak / 2**30:.2f} GiB; RSS min/median/max GiB per quarter: {spread}; results: {out}")


if __name__ == "__main__":
    main()
