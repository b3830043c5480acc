"""Research checks of the cache-aware policies, through the `run` job users start (not a test; the
numbers go in docs/kv-hierarchy.md).

  policies  — FCFS `chunked` vs `lpm` vs `dfs_weight` on a Mooncake trace under load, over
              several bootstrap replicates of the trace (trace.replicate=1..R): prefix-cache hit
              rate, TTFT mean and p99, as mean ± 95 % Student-t interval over the replicates.
  starvation — the same trace with a stream of requests that hit behind one that does not: the
              worst TTFTs of `lpm` without aging and of `dfs_weight`, with and without max_wait_s
              (the bound against starvation), with `chunked` for reference.

The trace is a shipped Mooncake config by name (`--trace mooncake_synthetic`: downloaded once with
`python -m policylab trace download mooncake_synthetic`) plus trace.* overrides (a window, a load),
or a Mooncake-format file written by `policylab.testing.kv_traces.mooncake_style` when `--trace`
is `generated` (no download). Replayed on the sim plane, Llama-3-8B on an H100.
Usage: python experiments/cache_policy_check.py [--trace mooncake_synthetic] [--replicates 5]
       [--out DIR] [--check policies,starvation] [trace.OVERRIDE=VALUE ...]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # this checkout's policylab and policies
from policylab.apps.cli import main  # noqa: E402
from policylab.testing.kv_traces import mooncake_style  # noqa: E402

POLICIES = (("chunked (FCFS)", ["policy=chunked"]), ("lpm", ["policy=lpm"]), ("dfs_weight", ["policy=dfs_weight"]),
            ("dfs_weight, no bound", ["policy=dfs_weight", "policy.max_wait_s=null"]))


def write_generated(path: Path, requests: int = 600, rate: float = 7.0) -> None:
    """The Mooncake-format trace of experiments/kv_hierarchy_check.py (shared system prompt)."""
    trace = mooncake_style(requests, 0, rate=rate, segment=512, groups=8, max_depth=6, output=(32, 384))
    with path.open("w") as f:
        for t in trace:
            f.write(json.dumps({"timestamp": round(t.arrival_time * 1000, 3), "input_length": t.prompt_tokens,
                                "output_length": t.output_tokens, "hash_ids": list(t.prefix_hashes)}) + "\n")


def run(trace_args: list, out: Path, name: str, overrides: list) -> dict:
    args = ["run", *trace_args, "model=llama3-8b", "hardware=h100", "dataplane=sim", "logger=none", "plots=false",
            "progress=false", f"hydra.run.dir={out / name}", *overrides]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(args)
    return json.loads((out / name / "summary.json").read_text())


def worst_ttfts(out: Path, name: str, k: int) -> list:
    import pandas as pd
    frame = pd.read_parquet(out / name / "requests.parquet")
    ttft = frame["ttft"].dropna().sort_values()
    return list(ttft.iloc[-k:])


def interval(values: list) -> str:
    """mean ± 95 % Student-t half width (t(0.975, n-1) s / sqrt n), as compare pools replicates."""
    from scipy import stats
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:,.3g}"
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return f"{mean:,.4g} ± {half:,.2g}"


def check_policies(trace_args: list, out: Path, replicates: int) -> None:
    print(f"policies over {replicates} replicates (mean ± 95 % CI; TTFT in s); the last two columns are "
          f"paired with FCFS on the same replicate")
    print(f"{'policy':22} {'hit rate %':>14} {'TTFT mean':>14} {'TTFT p99':>14} {'max TTFT':>14} "
          f"{'Δ hit rate pts':>15} {'TTFT mean / FCFS':>17}")
    fcfs = None
    for label, extra in POLICIES:
        rows = []
        for k in range(1, replicates + 1):
            name = label.split()[0] + ("_nobound" if "no bound" in label else "")
            s = run(trace_args, out, f"{name}_rep{k}", [*extra, f"trace.replicate={k}"])
            rows.append((100 * s["prefix_cache_hit_rate"], s["ttft"]["mean"], s["ttft"]["p99"], s["ttft"]["max"]))
        fcfs = fcfs or rows
        paired = ([r[0] - f[0] for r, f in zip(rows, fcfs)], [r[1] / f[1] for r, f in zip(rows, fcfs)])
        print(f"{label:22} " + " ".join(f"{interval([r[i] for r in rows]):>14}" for i in range(4)) +
              f" {interval(paired[0]):>15} {interval(paired[1]):>17}")


def check_starvation(trace_args: list, out: Path, bound: float) -> None:
    print(f"\nstarvation (trace.replicate=0): worst TTFTs in s; bound max_wait_s={bound}")
    print(f"{'policy':34} {'hit rate %':>10} {'TTFT p99':>9} {'worst 5 TTFT (s)':>34}")
    for label, extra in (("chunked (FCFS)", ["policy=chunked"]),
                         ("lpm, no aging, no bound", ["policy=lpm", "policy.aging_rate=0"]),
                         ("lpm, no aging, max_wait_s", ["policy=lpm", "policy.aging_rate=0",
                                                        f"policy.max_wait_s={bound}"]),
                         ("dfs_weight, no bound", ["policy=dfs_weight", "policy.max_wait_s=null"]),
                         ("dfs_weight, max_wait_s", ["policy=dfs_weight", f"policy.max_wait_s={bound}"])):
        name = "starve_" + label.replace(",", "").replace(" ", "_").replace("(", "").replace(")", "")
        s = run(trace_args, out, name, extra)
        worst = ", ".join(f"{x:.1f}" for x in worst_ttfts(out, name, 5))
        print(f"{label:34} {100 * s['prefix_cache_hit_rate']:>10.1f} {s['ttft']['p99']:>9.1f} {worst:>34}")


def main_check() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="mooncake_synthetic",
                    help="a trace config name (configs/trace/) or 'generated' (mooncake_style, no download)")
    ap.add_argument("--replicates", type=int, default=5)
    ap.add_argument("--bound", type=float, default=30.0, help="max_wait_s of the starvation check")
    ap.add_argument("--check", default="policies,starvation")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("overrides", nargs="*", help="trace.* and engine.* overrides for every run")
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="cache_policy_"))
    out.mkdir(parents=True, exist_ok=True)
    if a.trace == "generated":
        write_generated(out / "mooncake_style.jsonl")
        trace_args = ["trace=mooncake", f"trace.path={out / 'mooncake_style.jsonl'}"]
    else:
        trace_args = [f"trace={a.trace}"]
    trace_args += a.overrides
    print(f"trace: {' '.join(trace_args)}; results in {out}\n")
    checks = a.check.split(",")
    if "policies" in checks:
        check_policies(trace_args, out, a.replicates)
    if "starvation" in checks:
        check_starvation(trace_args, out, a.bound)


if __name__ == "__main__":
    main_check()
