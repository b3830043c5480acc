"""Measure a GPU's roofline parameters from Vidur's per-op kernel times, pooled over every model.

Each parameter is read off the regime where it alone sets the time, on the four GEMMs of a
block (QKV, O, up, down) of all the GPU's profiles at TP 1, never fitted to step totals:

- streaming: at num_tokens <= 16 a GEMM is a GEMV that streams its weights, so
  t = kernel_latency + bytes / (bw_efficiency x peak bandwidth). A least-squares line in
  relative error over all (model, op, n) gives both; the latency is the time a kernel costs
  however small (launch, pipeline fill, the last wave's tail);
- compute: at 1,024 <= num_tokens <= 4,096 (the range every profile covers, so each model
  counts alike) a GEMM is FLOP-bound: flops_efficiency = the geometric mean of
  2nKN / ((t - kernel_latency) x peak FLOP/s).

Usage (a Vidur checkout's data/profiling, or its compute/ folder):

    python experiments/measure_gpu_efficiencies.py /tmp/vidur_profiles [--gpus a100 h100 a40]
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np

from vidur_profiles import cases

STREAM_MAX_TOKENS = 16
COMPUTE_TOKENS = (1024, 4096)


def gemm_points(case) -> list:
    """(n, bytes, flops, seconds) of every profiled GEMM of this model at TP 1."""
    n = case.column("num_tokens")
    b = case.model.dtype_bytes
    out = []
    for op, (k, m) in case.gemm_shapes().items():
        t = case.column(f"time_stats.{op}.median") / 1e3
        out += [(x, (k * m + x * (k + m)) * b, 2 * x * k * m, y) for x, y in zip(n, t)]
    return out


def measure(points, hw) -> dict:
    p = np.array(points)
    n, nbytes, flops, t = p.T
    low = n <= STREAM_MAX_TOKENS
    A = np.stack([np.ones(low.sum()), nbytes[low]], 1) / t[low, None]
    (latency, s_per_byte), *_ = np.linalg.lstsq(A, np.ones(low.sum()), rcond=None)
    resid = A @ np.array([latency, s_per_byte]) - 1
    high = (n >= COMPUTE_TOKENS[0]) & (n <= COMPUTE_TOKENS[1])
    eff = flops[high] / (t[high] - latency) / hw.peak_flops
    return {"bw_efficiency": 1 / s_per_byte / hw.mem_bandwidth, "kernel_latency": latency,
            "stream_rms": float(np.sqrt(np.mean(resid ** 2))), "stream_max": float(np.abs(resid).max()),
            "stream_points": int(low.sum()), "flops_efficiency": float(np.exp(np.log(eff).mean())),
            "flops_p10": float(np.quantile(eff, 0.1)), "flops_p90": float(np.quantile(eff, 0.9)),
            "compute_points": int(high.sum())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", type=Path, help="Vidur's data/profiling (or its compute/ folder)")
    ap.add_argument("--gpus", nargs="*", help="only these GPUs (default: every one with configs/hardware/<gpu>.yaml)")
    args = ap.parse_args()
    pooled, hw, models = defaultdict(list), {}, defaultdict(list)
    for case in cases(args.root, args.gpus):
        pooled[case.gpu] += gemm_points(case)
        hw[case.gpu] = case.hardware
        models[case.gpu].append(case.name)
    print("| GPU | models | bw_efficiency | kernel_latency | GEMV fit error (rms / max) "
          "| flops_efficiency (p10-p90 of the GEMMs) |")
    print("|---|---|---|---|---|---|")
    for gpu, points in pooled.items():
        r = measure(points, hw[gpu])
        print(f"| {gpu} | {len(models[gpu])} | {r['bw_efficiency']:.3f} | {r['kernel_latency'] * 1e6:.2f} us "
              f"| {r['stream_rms'] * 100:.1f} % / {r['stream_max'] * 100:.0f} % ({r['stream_points']} GEMVs) "
              f"| {r['flops_efficiency']:.3f} ({r['flops_p10']:.2f}-{r['flops_p90']:.2f}, "
              f"{r['compute_points']} GEMMs) |")


if __name__ == "__main__":
    main()
