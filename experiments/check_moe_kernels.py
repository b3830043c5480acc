"""vLLM's fused-MoE kernel (`serving_engine=vllm`: fused_moe_tiles) against vLLM's own timings of it.

The timings are `benchmarks/kernels/benchmark_moe.py`'s "kernel time" of one MoE layer's routed experts
(the two grouped GEMMs with their alignment, activation and sum), BF16, as posted in vLLM pull requests:

- PR #24700 (H100 SXM, Mixtral-8x7B at TP 2: 8 experts of width 7,168 on each GPU, hidden 4,096, top-2;
  the tuned configuration E=8,N=7168 of vLLM's configs directory), 15 token counts from 1 to 1,536;
- PR #44818 (H200, Gemma-4's MoE: 128 experts of width 704, hidden 2,816, top-8), tuned and default
  tiles, 18 token counts from 1 to 4,096. Below 16 tokens its times stay at 185-204 us, 9x its 8
  experts' weights at the H200's bandwidth (Mixtral's 1-token time is 1.2x its 2 experts'): a fixed
  cost of that benchmark's own, so its points below 16 tokens are printed and left out of the summary.

Each is priced as `ShapedCostModel.expert_time` of the shape's padded FLOPs and bytes in the `vllm`
engine, and, for comparison, as a dense GEMM's (`--tile-overhead 0 --p-norm 4`: the rate and knee
the experts had before the kernel's own terms). `--fit` searches the tile overhead and the knee.

    python experiments/check_moe_kernels.py [--fit] [--tile-overhead K] [--p-norm P]
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import policylab.dataplane.shaped as shaped  # noqa: E402
from policylab.apps.sim_check import load_group  # noqa: E402
from policylab.core.config import HardwareConfig, ModelConfig  # noqa: E402
from policylab.dataplane.moe import expert_gemm_terms  # noqa: E402
from policylab.dataplane.serving_engine import ServingEngine, ServingEngineConfig  # noqa: E402

# vLLM PR #24700, "Tuned Config" (Mixtral-8x7B-Instruct-v0.1, -tp=2, H100 80GB HBM3): tokens -> us
PR24700_MIXTRAL_TP2_H100 = {1: 144.03, 2: 229.28, 4: 351.10, 8: 434.98, 16: 471.49, 24: 478.27, 32: 487.35,
                            48: 487.85, 64: 483.14, 96: 494.42, 128: 491.39, 256: 536.77, 512: 662.33,
                            1024: 833.72, 1536: 1122.93}
# vLLM PR #44818 (E=128, N=704, K=2816, top_k=8, BF16, H200): tokens -> (default us, tuned us)
PR44818_GEMMA4_H200 = {1: (189.2, 185.1), 2: (187.0, 188.9), 4: (185.4, 185.1), 8: (200.0, 204.4),
                       16: (257.8, 264.1), 24: (314.4, 314.4), 32: (341.1, 324.9), 48: (382.8, 365.5),
                       64: (391.8, 384.1), 96: (405.6, 390.3), 128: (409.1, 396.4), 256: (419.8, 419.6),
                       512: (442.2, 442.3), 1024: (536.5, 528.4), 1536: (585.4, 582.0), 2048: (742.9, 728.2),
                       3072: (992.9, 962.9), 4096: (1249.5, 1189.6)}
SUMMARY_FROM = 16          # tokens: Gemma-4's table below this carries its benchmark's fixed cost (module doc)
# Gemma-4's MoE layer as the kernel sees it (the PR's E, N, K, top_k); its attention is not priced here
GEMMA4_MOE = ModelConfig(name="gemma4-moe", hidden_size=2816, intermediate_size=2816, num_hidden_layers=1,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=176, vocab_size=262144,
                         num_experts=128, num_experts_per_tok=8, moe_intermediate_size=704)


def cases() -> list:
    """(label, model, GPU, tensor parallelism, {tokens: measured us}) of each table."""
    mixtral = load_group("model", "mixtral-8x7b", ModelConfig)
    h100, h200 = (load_group("hardware", g, HardwareConfig) for g in ("h100", "h200"))
    return [("Mixtral-8x7B TP 2, H100, tuned (PR #24700)", mixtral, h100, 2, PR24700_MIXTRAL_TP2_H100),
            ("Gemma-4 MoE, H200, tuned (PR #44818)", GEMMA4_MOE, h200, 1,
             {n: t for n, (_, t) in PR44818_GEMMA4_H200.items()}),
            ("Gemma-4 MoE, H200, default tiles (PR #44818)", GEMMA4_MOE, h200, 1,
             {n: d for n, (d, _) in PR44818_GEMMA4_H200.items()})]


def errors(tile_overhead: float, p_norm: float) -> list:
    """(label, tokens, measured us, predicted us) of every point, the kernel priced with these terms."""
    engine = ServingEngine(replace(load_group("serving_engine", "vllm", ServingEngineConfig),
                                   fused_moe_tile_overhead=tile_overhead))
    out = []
    for label, model, hw, tp, table in cases():
        cm = shaped.ShapedCostModel(model, hw, tp, 1, engine)
        cm._expert_p = p_norm                           # the knee under test (the model's: FUSED_MOE_P_NORM)
        s = cm.shape
        for n, us in table.items():
            flops, traffic = expert_gemm_terms(n, s.hidden, s.expert_f, s.experts, s.top_k, s.dtype_bytes,
                                               s.weight_elem_bytes, True, False)
            out.append((label, n, us, (cm.expert_time(flops, traffic) + cm._moe_floor) * 1e6))
    return out


def summary(rows: list) -> tuple:
    """(MAPE, worst error) over the points from SUMMARY_FROM tokens."""
    err = np.array([p / m - 1 for _, n, m, p in rows if n >= SUMMARY_FROM])
    return float(np.mean(np.abs(err))), float(err[np.argmax(np.abs(err))])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tile-overhead", type=float, default=None,
                    help=f"serving_engine.fused_moe_tile_overhead (default {shaped.FUSED_MOE_TILE_OVERHEAD:g})")
    ap.add_argument("--p-norm", type=float, default=shaped.FUSED_MOE_P_NORM,
                    help=f"the kernel's knee between compute and weights (default {shaped.FUSED_MOE_P_NORM:g})")
    ap.add_argument("--fit", action="store_true", help="search the tile overhead and the knee")
    args = ap.parse_args()
    overhead = shaped.FUSED_MOE_TILE_OVERHEAD if args.tile_overhead is None else args.tile_overhead
    if args.fit:
        grid = [(summary(errors(k, p))[0], k, p) for p in (2.0, 3.0, 4.0) for k in range(0, 1601, 100)]
        for mape, k, p in sorted(grid)[:8]:
            print(f"tile overhead {k:5.0f}, p {p:g}: MAPE {mape:.1%}")
        return
    rows = errors(overhead, args.p_norm)
    print(f"vLLM's fused-MoE kernel, tile overhead {overhead:g}, p {args.p_norm:g} "
          f"(a dense GEMM's terms: tile overhead 0, p {shaped.GEMM_P_NORM:g})\n")
    print("| table | tokens | measured us | predicted us | error |\n|---|---|---|---|---|")
    for label, n, m, p in rows:
        print(f"| {label} | {n:,} | {m:.1f} | {p:.1f} | {p / m - 1:+.1%} |")
    mape, worst = summary(rows)
    dense = summary(errors(0.0, shaped.GEMM_P_NORM))
    print(f"\nfrom {SUMMARY_FROM} tokens ({sum(n >= SUMMARY_FROM for _, n, _, _ in rows)} points): MAPE {mape:.1%}, "
          f"worst {worst:+.1%}; as a dense GEMM: {dense[0]:.1%}, worst {dense[1]:+.1%}")


if __name__ == "__main__":
    main()
