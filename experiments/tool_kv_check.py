"""Research check: what to do with a request's KV while it waits for a tool call, under KV
pressure (not a test; the numbers go in docs/tool-calls.md).

The shipped Poisson trace gets tool calls from the `trace.tool_calls` transform (2 calls per
request, exponential durations of mean `--duration` s, 64 result tokens each; the draws are
seeded by the run seed, so each seed is a replicate with other tool timings). It replays on
the sim plane (Llama-3-8B shape on an H100) with a KV cache too small for every paused
request to keep its blocks, and a host tier that holds them all, under `engine.tool_kv` =
keep | free | offload (forced) and policy (the policy's `on_tool_call`, here its default
rule), and policy without a host tier, for chunked (FCFS) and plas. For each: job completion time p50/p99 (tools' time
included), TTFT p99, tokens recomputed because KV was freed, blocks offloaded, mean ± 95 %
half-width over the seeds.
Usage: python experiments/tool_kv_check.py [--seeds 3] [--rate 3] [--blocks 600] [--duration 1.0] [--out DIR]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # this checkout's policylab and policies
from policylab.apps.cli import main  # noqa: E402

T95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 8: 2.36, 10: 2.26}


def run(out: Path, name: str, overrides: list) -> dict:
    args = ["run", "trace=poisson", "model=llama3-8b", "hardware=h100", "dataplane=sim", "logger=none",
            "plots=false", "progress=false", f"hydra.run.dir={out / name}", *overrides]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(args)
    return json.loads((out / name / "summary.json").read_text())


def mean_half(values: list) -> tuple:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, T95.get(n, 2.0) * sd / math.sqrt(n)


def cell(values: list, scale: float = 1.0, digits: int = 0) -> str:
    m, h = mean_half([v * scale for v in values])
    return f"{m:,.{digits}f} ± {h:,.{digits}f}"


def main_check() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=3.0, help="trace.rate_scale (the trace is 4 req/s)")
    ap.add_argument("--blocks", type=int, default=600, help="engine.num_blocks (16 tokens each)")
    ap.add_argument("--duration", type=float, default=1.0, help="mean tool duration, s")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="tool_kv_"))
    common = [f"trace.rate_scale={a.rate}", f"trace.max_requests={a.requests}", f"engine.num_blocks={a.blocks}",
              f"+trace.tool_calls={{calls: 2, duration_s: {a.duration}, result_tokens: 64}}"]
    print(f"trace=poisson ({a.requests} requests) x rate_scale {a.rate}, 2 tool calls each (mean {a.duration} s, "
          f"64 tokens), {a.blocks} KV blocks, host tier 20000 blocks (none where the row says so); {a.seeds} seeds; run dirs under {out}\n")
    print("| policy | tool_kv | JCT p50 (s) | JCT p99 (s) | TTFT p99 (ms) | recomputed tokens | "
          "blocks offloaded | kept / freed / offloaded |")
    print("|---|---|---|---|---|---|---|---|")
    for policy in ("chunked", "plas"):
        for mode in ("keep", "free", "offload", "policy", "policy, no host tier"):
            extra = ["engine.tool_kv=policy", "engine.host_kv_blocks=0"] if mode.endswith("no host tier") else \
                [f"engine.tool_kv={mode}", "engine.host_kv_blocks=20000"]
            rows = [run(out, f"{policy}_{mode.replace(', ', '_').replace(' ', '-')}_{seed}",
                        [f"policy={policy}", *common, *extra, f"seed={seed}"]) for seed in range(a.seeds)]
            bad = [r for r in rows if r["counts"]["finished"] != r["counts"]["requests"]]
            p = [r["programs"] for r in rows]
            split = " / ".join(f"{sum(x[k] for x in p) / len(p):,.0f}" for k in ("kept", "freed", "offloaded"))
            print(f"| {policy} | {mode} | {cell([x['jct']['p50'] for x in p], digits=2)} | "
                  f"{cell([x['jct']['p99'] for x in p], digits=2)} | {cell([r['ttft']['p99'] for r in rows], 1e3)} | "
                  f"{cell([x['recomputed_tokens'] for x in p])} | {cell([x['offloaded_blocks'] for x in p])} | "
                  f"{split} |" + (f" ({len(bad)} runs unfinished)" if bad else ""))


if __name__ == "__main__":
    main_check()
