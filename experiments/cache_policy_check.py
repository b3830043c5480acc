"""Research checks of the cache-aware policies, through the `run` job users start (not a test; the
numbers go in docs/kv-hierarchy.md).

  policies  — FCFS `chunked` vs `lpm` vs `dfs_weight` on a Mooncake trace under load, over
              several bootstrap replicates of the trace (trace.replicate=1..R): prefix-cache hit
              rate, TTFT mean and p99, as mean ± 95 % Student-t interval over the replicates.
  starvation — a generated Mooncake-format stream of requests extending one cached prefix,
              faster than served, with 1 request in 25 that hits nothing: the TTFTs of those
              under `lpm` without aging and `dfs_weight`, with and without max_wait_s (the bound
              against starvation), with `chunked` and `lpm`'s aging for reference.

The trace is a shipped Mooncake config by name (`--trace mooncake_synthetic`: downloaded once with
`python -m policylab trace download mooncake_synthetic`) plus trace.* overrides (a window, a load),
or a Mooncake-format file written by `policylab.testing.kv_traces.mooncake_style` when `--trace`
is `generated` (no download). Replayed on the sim plane, Llama-3-8B on an H100.
Usage: python experiments/cache_policy_check.py [--trace mooncake_synthetic] [--replicates 5]
       [--bound 10] [--stream-load 5] [--out DIR] [--check policies,starvation] [trace.OVERRIDE=VALUE ...]
(the overrides apply to the policies check's trace; a run already under --out is reused)
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


def write_stream(path: Path, requests: int, rate: float, loner_every: int = 25) -> None:
    """Requests extending one cached 4,096-token prefix (8 hash ids) by a 512-token tail of their
    own, Poisson at `rate`, and every `loner_every`-th request a 4,096-token prompt of its own
    (no hits): a cache-aware order without a bound serves the stream first."""
    import random
    rng, t = random.Random(0), 0.0
    with path.open("w") as f:
        for i in range(requests):
            t += rng.expovariate(rate)
            ids = [10_000 + 10 * i + k for k in range(8)] if i % loner_every == 1 else list(range(8)) + [100_000 + i]
            f.write(json.dumps({"timestamp": round(t * 1000, 3), "input_length": 512 * len(ids),
                                "output_length": rng.randint(32, 256), "hash_ids": ids}) + "\n")


def run(trace_args: list, out: Path, name: str, overrides: list) -> dict:
    args = ["run", *trace_args, "model=llama3-8b", "hardware=h100", "dataplane=sim", "logger=none", "plots=false",
            "progress=false", f"hydra.run.dir={out / name}", *overrides]
    summary = out / name / "summary.json"
    if not summary.exists():              # (a run already under --out is reused: an interrupted check resumes)
        with contextlib.redirect_stdout(io.StringIO()):
            main(args)
    return json.loads(summary.read_text())


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
            name = label.split()[0].rstrip(",") + ("_nobound" if "no bound" in label else "")
            s = run(trace_args, out, f"{name}_rep{k}", [*extra, f"trace.replicate={k}"])
            rows.append((100 * s["prefix_cache_hit_rate"], s["ttft"]["mean"], s["ttft"]["p99"], s["ttft"]["max"]))
        fcfs = fcfs or rows
        paired = ([r[0] - f[0] for r, f in zip(rows, fcfs)], [r[1] / f[1] for r, f in zip(rows, fcfs)])
        print(f"{label:22} " + " ".join(f"{interval([r[i] for r in rows]):>14}" for i in range(4)) +
              f" {interval(paired[0]):>15} {interval(paired[1]):>17}")


def check_starvation(out: Path, bound: float, rate_scale: float) -> None:
    """The stream of `write_stream` at `rate_scale` × 12 req/s: the TTFTs of the requests with no
    hits (1 in 25) against the others', with and without the bound."""
    write_stream(out / "stream.jsonl", 1500, 12.0)
    trace_args = ["trace=mooncake", f"trace.path={out / 'stream.jsonl'}", f"trace.rate_scale={rate_scale}"]
    print(f"\nstarvation: 1,500 requests at {12 * rate_scale:g} req/s, 1 in 25 with no hits; TTFT in s; "
          f"bound max_wait_s={bound}")
    print(f"{'policy':28} {'hit rate %':>10} {'others p99':>11} {'no-hit mean':>12} {'no-hit max':>11}")
    import pandas as pd
    for label, extra in (("chunked (FCFS)", ["policy=chunked"]),
                         ("lpm (aging 1000)", ["policy=lpm"]),
                         ("lpm, no aging", ["policy=lpm", "policy.aging_rate=0"]),
                         ("lpm, no aging, max_wait_s", ["policy=lpm", "policy.aging_rate=0",
                                                        f"policy.max_wait_s={bound}"]),
                         ("dfs_weight, no bound", ["policy=dfs_weight", "policy.max_wait_s=null"]),
                         ("dfs_weight, max_wait_s", ["policy=dfs_weight", f"policy.max_wait_s={bound}"])):
        name = "stream_" + label.replace(",", "").replace(" ", "_").replace("(", "").replace(")", "")
        s = run(trace_args, out, name, extra)
        frame = pd.read_parquet(out / name / "requests.parquet")
        loner = frame["req_id"] % 25 == 1
        print(f"{label:28} {100 * s['prefix_cache_hit_rate']:>10.1f} {frame['ttft'][~loner].quantile(0.99):>11.1f} "
              f"{frame['ttft'][loner].mean():>12.1f} {frame['ttft'][loner].max():>11.1f}")


def main_check() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="mooncake_synthetic",
                    help="a trace config name (configs/trace/) or 'generated' (mooncake_style, no download)")
    ap.add_argument("--replicates", type=int, default=5)
    ap.add_argument("--bound", type=float, default=10.0, help="max_wait_s of the starvation check")
    ap.add_argument("--stream-load", type=float, default=5.0, help="trace.rate_scale of the starvation stream")
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
        check_starvation(out, a.bound, a.stream_load)


if __name__ == "__main__":
    main_check()
