"""Research checks of the KV hierarchy's levers, through the `run` job users start (not a test;
the numbers go in docs/kv-hierarchy.md).

A Mooncake-format trace from `policylab.testing.kv_traces.mooncake_style` (conversations that
extend one shared system prompt, 512-token hash ids, Poisson arrivals) replays on the sim plane
(Llama-3-8B shape on an H100) with a small KV cache, so the levers matter:
  swap      — chunked, preemption by recompute vs by swap over PCIe 4 and NVLink-C2C, with the
              prefix cache on and off: TTFT/TPOT p99, preemptions, recomputed tokens, blocks
              moved, transfer time;
  index     — the chained-hash map vs the radix tree (engine.prefix_cache): hit rate, TTFT;
  lpm       — FCFS chunked vs lpm (aging 1000 tokens/s) vs lpm without aging: hit rate, TTFT
              p50/p99 and the worst TTFT (the starvation aging bounds).
Usage: python experiments/kv_hierarchy_check.py [--requests 600] [--rate 6] [--blocks 1500] [--out DIR]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # this checkout's policylab and policies
from policylab.apps.cli import main  # noqa: E402
from policylab.testing.kv_traces import mooncake_style  # noqa: E402


def write_trace(path: Path, requests: int, rate: float, seed: int = 0) -> None:
    trace = mooncake_style(requests, seed, rate=rate, segment=512, groups=8, max_depth=6, output=(32, 384))
    with path.open("w") as f:
        for t in trace:
            f.write(json.dumps({"timestamp": round(t.arrival_time * 1000, 3), "input_length": t.prompt_tokens,
                                "output_length": t.output_tokens, "hash_ids": list(t.prefix_hashes)}) + "\n")


def run(trace: Path, out: Path, name: str, overrides: list) -> dict:
    args = ["run", "trace=mooncake", f"trace.path={trace}", "model=llama3-8b", "hardware=h100", "dataplane=sim",
            "logger=none", "plots=false", "progress=false", f"hydra.run.dir={out / name}", *overrides]
    with contextlib.redirect_stdout(io.StringIO()):
        main(args)
    return json.loads((out / name / "summary.json").read_text())


def ms(x) -> str:
    return "—" if x is None else f"{1000 * x:,.0f}"


def main_check() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--rate", type=float, default=6.0)
    ap.add_argument("--blocks", type=int, default=1500, help="engine.num_blocks (16 tokens each)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="kv_hierarchy_"))
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "mooncake_style.jsonl"
    write_trace(trace, a.requests, a.rate)
    kv = [f"engine.num_blocks={a.blocks}"]
    print(f"trace: {a.requests} requests at {a.rate} req/s; KV {a.blocks} blocks x 16 tokens; results in {out}\n")

    print("swap vs recompute (chunked)")
    print(f"{'preemption':24} {'TTFT p99':>9} {'TPOT p99':>9} {'preempt':>8} {'recomputed':>11} {'moved blk':>10} "
          f"{'transfer s':>10}")
    host = [f"engine.host_kv_blocks={4 * a.blocks}"]
    for name, extra in (("recompute", []), ("swap pcie4", ["policy.preempt_mode=swap", "engine.swap_link=pcie4"]),
                        ("swap pcie4 overlapped", ["policy.preempt_mode=swap", "engine.swap_link=pcie4",
                                                   "engine.swap_overlap=true"]),
                        ("swap nvlink_c2c", ["policy.preempt_mode=swap", "engine.swap_link=nvlink_c2c"]),
                        ("recompute, no cache", ["engine.enable_prefix_caching=false"]),
                        ("swap pcie4, no cache", ["policy.preempt_mode=swap", "engine.enable_prefix_caching=false"])):
        s = run(trace, out, name.replace(",", "").replace(" ", "_"), ["policy=chunked", *kv, *host, *extra])
        h = s["kv_hierarchy"]
        print(f"{name:24} {ms(s['ttft']['p99']):>9} {ms(s['tpot']['p99']):>9} {s['preemptions']:>8} "
              f"{h['recomputed_tokens']:>11,} {h['swapped_out_blocks'] + h['swapped_in_blocks']:>10,} "
              f"{h['transfer_time']:>10.3f}")

    print("\nprefix index (chunked)")
    print(f"{'index':24} {'hit rate':>9} {'TTFT p50':>9} {'TTFT p99':>9}")
    for index in ("hash", "radix"):
        s = run(trace, out, f"index_{index}", ["policy=chunked", *kv, f"engine.prefix_cache={index}"])
        print(f"{index:24} {s['prefix_cache_hit_rate']:>9.1%} {ms(s['ttft']['p50']):>9} {ms(s['ttft']['p99']):>9}")

    print("\nlpm vs FCFS")
    print(f"{'policy':24} {'hit rate':>9} {'TTFT p50':>9} {'TTFT p99':>9} {'TTFT max':>9}")
    for name, extra in (("chunked (FCFS)", ["policy=chunked"]), ("lpm aging 1000", ["policy=lpm"]),
                        ("lpm no aging", ["policy=lpm", "policy.aging_rate=0"])):
        s = run(trace, out, name.split()[0] + ("_noaging" if "no aging" in name else ""), [*extra, *kv])
        print(f"{name:24} {s['prefix_cache_hit_rate']:>9.1%} {ms(s['ttft']['p50']):>9} {ms(s['ttft']['p99']):>9} "
              f"{ms(s['ttft']['max']):>9}")


if __name__ == "__main__":
    main_check()
