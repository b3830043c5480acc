"""What share of peak Vidur's profiled GEMMs reach, by waves of output tiles, token count and GEMM.

Every TP-1 GEMM of a GPU's Vidur mlp.csv profiles (QKV, O, up, down; medians, duplicates
averaged) as efficiency = 2 m K N / (t x peak FLOP/s) for m tokens, K x N weights and time t,
grouped by the waves its output tiles make (`gemm_wave_tile_m` x `gemm_wave_tile_n` tiles, rows
below the tile's at the least power of two >= 16, over `num_sms`), by m, and per GEMM at
>= 2,049 tokens; then by how full the last wave is (a persistent kernel's efficiency does not
depend on it, a wave-quantised one's does), and one GEMM's time around two wave boundaries. It is
what tells a library that runs persistent GEMMs from one that steps at wave boundaries: the
comparison with `persistent_gemm_efficiency` (docs/fidelity.md) rests on it.

    python experiments/vidur_gemm_efficiency.py VIDUR_PROFILING_ROOT [--gpu h100]
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from vidur_profiles import cases

WAVES = ((0, 0.5), (0.5, 1), (1, 1.5), (1.5, 2), (2, 3), (3, 5), (5, 10), (10, 20), (20, math.inf))
TOKENS = ((129, 511), (512, 2048), (2049, 1 << 20))
FILL = ((0, 0.7), (0.7, 0.8), (0.8, 0.9), (0.9, 0.999), (0.999, 1.001))
STEP_GEMM = ("Qwen-72B", "attn_pre_proj", range(232, 600, 8))     # QKV, N 24,576, K 8,192


def points(case) -> list:
    """(op, m, K, N, seconds, efficiency, waves) of every GEMM of the profile."""
    hw = case.hardware
    n = case.column("num_tokens").astype(int)
    out = []
    for op, (k, cols) in case.gemm_shapes().items():
        times: dict = {}
        for x, t in zip(n, case.column(f"time_stats.{op}.median") / 1e3):
            times.setdefault(int(x), []).append(t)
        for m, ts in sorted(times.items()):
            t = float(np.mean(ts))
            tm = min(int(hw.gemm_wave_tile_m), max(16, 1 << (m - 1).bit_length()))
            tiles = -(-m // tm) * -(-cols // int(hw.gemm_wave_tile_n))
            out.append((op, m, k, cols, t, 2 * m * k * cols / t / hw.peak_flops, tiles / hw.num_sms))
    return out


def line(label: str, eff) -> str:
    e = np.asarray(eff)
    return (f"| {label} | {len(e)} | {np.median(e):.3f} | {np.percentile(e, 10):.3f} | "
            f"{np.percentile(e, 90):.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", type=Path, help="Vidur's data/profiling (or its compute/ folder)")
    ap.add_argument("--gpu", default="h100")
    args = ap.parse_args()
    found = cases(args.root, [args.gpu])
    per = {case.name: points(case) for case in found}
    every = [p for pts in per.values() for p in pts]
    head = "| {} | points | median | p10 | p90 |\n|---|---|---|---|---|"
    print(f"{args.gpu}: share of peak FLOP/s of {len(every)} GEMM timings ({len(found)} models, TP 1)\n")
    print(head.format("waves of output tiles (m >= 128)"))
    for lo, hi in WAVES:
        e = [p[5] for p in every if p[1] >= 128 and lo <= p[6] < hi]
        if e:
            print(line(f"{lo}-{hi}" if hi < math.inf else f">= {lo}", e))
    print("\n" + head.format("tokens m"))
    for lo, hi in TOKENS:
        print(line(f"{lo:,}-{hi:,}" if hi < 1 << 20 else f">= {lo:,}", [p[5] for p in every if lo <= p[1] <= hi]))
    print("\n" + head.format("GEMM (K x N), m >= 2,049"))
    for name, pts in per.items():
        for op in dict.fromkeys(p[0] for p in pts):
            sel = [p for p in pts if p[0] == op and p[1] >= 2049]
            if sel:
                print(line(f"{name} {op} ({sel[0][2]:,} x {sel[0][3]:,})", [p[5] for p in sel]))
    print("\n" + head.format("last wave's fill (1-8 waves, m >= 128)"))
    sel = [p for p in every if p[1] >= 128 and 1 <= p[6] <= 8]
    fill = np.array([p[6] / math.ceil(p[6]) for p in sel])
    eff = np.array([p[5] for p in sel])
    for lo, hi in FILL:
        mask = (fill >= lo) & (fill < hi)
        if mask.any():
            print(line(f"{lo}-{hi}", eff[mask]))
    print(f"\ncorrelation of efficiency with the last wave's fill: {np.corrcoef(fill, eff)[0, 1]:.2f}")
    name, op, ms = STEP_GEMM
    if name in per:
        print(f"\n{name} {op}: tokens -> waves, us, efficiency\n")
        print("| m | waves | us | efficiency |\n|---|---|---|---|")
        for p in per[name]:
            if p[0] == op and p[1] in ms:
                print(f"| {p[1]} | {p[6]:.2f} | {p[4] * 1e6:.1f} | {p[5]:.3f} |")


if __name__ == "__main__":
    main()
