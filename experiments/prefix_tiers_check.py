"""Research check of the prefix cache's host and disk tiers, through the `run` job users start
(not a test; the numbers go in docs/kv-hierarchy.md).

A Mooncake-format trace (a slice of a published one with --trace, else the Mooncake-shaped trace
of `policylab.testing.kv_traces.mooncake_style`) replays on the sim plane (Llama-3-8B shape on an
H100) with `chunked` and a KV cache cut to --blocks blocks of 16 tokens, so that cached prefixes
are evicted; then with a host tier under the prefix cache, then with a host and a disk tier:
overall and per-tier hit rate, TTFT p50/p99, blocks offloaded and dropped, transfer time per tier.
Usage: python experiments/prefix_tiers_check.py [--trace FILE.jsonl] [--requests 400] [--rate 4]
       [--blocks 1000] [--host 4000] [--disk 16000] [--rate-scale 1] [--out DIR]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # this checkout's policylab and policies
from experiments.kv_hierarchy_check import ms, run, write_trace  # noqa: E402


def slice_trace(source: Path, path: Path, requests: int) -> None:
    """The first `requests` lines of a Mooncake JSONL file."""
    with source.open() as f, path.open("w") as out:
        for _, line in zip(range(requests), f):
            out.write(line)


def pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def main_check() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", type=Path, default=None, help="a Mooncake JSONL file (its first --requests lines)")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rate", type=float, default=4.0, help="arrivals of the generated trace (req/s)")
    ap.add_argument("--blocks", type=int, default=1000, help="engine.num_blocks (16 tokens each)")
    ap.add_argument("--host", type=int, default=4000, help="engine.prefix_host_blocks")
    ap.add_argument("--disk", type=int, default=16000, help="engine.prefix_disk_blocks")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="trace.rate_scale (arrival rate multiplier)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="prefix_tiers_"))
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "trace.jsonl"
    if a.trace:
        slice_trace(a.trace, trace, a.requests)
        what = f"the first {a.requests} requests of {a.trace.name}"
    else:
        write_trace(trace, a.requests, a.rate)
        what = f"{a.requests} Mooncake-style requests at {a.rate} req/s"
    print(f"trace: {what}; KV {a.blocks} blocks x 16 tokens; results in {out}\n")
    print(f"{'tiers':22} {'hit rate':>9} {'device':>8} {'host':>8} {'disk':>8} {'TTFT p50':>9} {'TTFT p99':>9} "
          f"{'offloaded':>10} {'dropped':>8} {'host s':>7} {'disk s':>7}")
    kv = ["policy=chunked", f"engine.num_blocks={a.blocks}", f"trace.rate_scale={a.rate_scale}"]
    for name, extra in (("device only", []),
                        ("+host", [f"engine.prefix_host_blocks={a.host}"]),
                        ("+host, overlap", [f"engine.prefix_host_blocks={a.host}", "engine.swap_overlap=true"]),
                        ("+host +disk", [f"engine.prefix_host_blocks={a.host}", f"engine.prefix_disk_blocks={a.disk}"]),
                        ("+host +disk, overlap", [f"engine.prefix_host_blocks={a.host}",
                                                  f"engine.prefix_disk_blocks={a.disk}", "engine.swap_overlap=true"])):
        s = run(trace, out, name.replace(" ", "_").replace(",", "").replace("+", ""), [*kv, *extra])
        h = s.get("kv_hierarchy") or {}
        device = h.get("device_hit_rate", s["prefix_cache_hit_rate"])
        print(f"{name:22} {pct(s['prefix_cache_hit_rate']):>9} {pct(device):>8} {pct(h.get('host_hit_rate')):>8} "
              f"{pct(h.get('disk_hit_rate')):>8} {ms(s['ttft']['p50']):>9} {ms(s['ttft']['p99']):>9} "
              f"{h.get('host_offloaded_blocks', 0):>10,} {h.get('dropped_blocks', 0):>8,} "
              f"{h.get('host_transfer_time', 0):>7.3f} {h.get('disk_transfer_time', 0):>7.3f}")


if __name__ == "__main__":
    main_check()
