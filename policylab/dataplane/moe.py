"""The routed experts of a mixture-of-experts layer: weight traffic grows with the batch.

With top-k routing of n tokens over E experts, each expert is missed by one token with
probability 1 - k/E, so (routing taken as uniform and independent, the balance the routers'
auxiliary losses train for) the expected number of distinct experts the batch touches is

    E x (1 - (1 - k/E)^n)

Each touched expert's weights (gate, up and down: 3 x hidden x width) are read once; the
n x k token-expert pairs do 2 x 3 x hidden x width FLOPs each. A decode step of one token reads
k experts, of 64 tokens nearly all of them: MoE decode cost grows with batch as on hardware,
where a dense model's stays flat until the GEMMs turn compute-bound. The two grouped GEMMs
(gate+up, down; a fused-MoE kernel each) join compute and memory as the dense GEMMs do.

Fused-MoE tiles (`serving_engine.fused_moe_tiles`, on under the vllm presets): vLLM's Triton kernel
sorts the token-expert pairs by expert and pads each expert's count up to a multiple of its row tile
BLOCK_SIZE_M (moe_align_block_size), which its tuned configuration picks by token count (16 rows for
a few tokens, 32 up to ~100, 64 up to ~500, 128 beyond); every padded row costs tensor-core work. So
the FLOPs are those of E x E[ceil(n_e / BLOCK_M) x BLOCK_M] rows, n_e ~ Binomial(n, k / E), not of
n x k pairs: at 128 decode tokens of Mixtral (top-2 of 8, ~32 a expert, 64-row tiles) twice the
pairs. The weights are still read once per touched expert: an expert's second row tile reuses its
weight tiles from L2 (the tuned configurations group row tiles, GROUP_SIZE_M, wherever one expert
needs several). The padding shows where the kernel is compute-bound (prefill chunks, large decode
batches of fine-grained experts), not in a weight-streaming decode step. What the kernel itself reaches
per tile (its fixed work per output tile, its looser overlap of compute and weights) is the shaped cost
model's (policylab.dataplane.shaped).

Untuned tiles (`serving_engine.fused_moe_config=default`): vLLM reads the kernel's tile configuration
for the model's expert count and width on the GPU from its configs directory; where it ships none it
warns "Using default MoE config. Performance might be sub-optimal!" and runs `get_default_config`'s
small tiles (16 x 32 x 64 for a few tokens). Those stream the experts' weights at a lower share of the
GPU's bandwidth and pay a fixed cost on top, both measured per GPU (`hardware.fused_moe_default_*`).
"""
from __future__ import annotations

from math import exp, lgamma, log, sqrt

# BLOCK_SIZE_M of vLLM's fused-MoE Triton kernel by token count: its tuned configuration for Mixtral-8x7B at
# TP 2 on H100 (vllm/model_executor/layers/fused_moe/configs/E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json;
# the entry of the nearest M: 16 rows up to 32 tokens, 32 up to 96, 64 up to 512, 128 beyond), as
# (largest token count, rows): the boundaries are the midpoints between its keys.
FUSED_MOE_BLOCK_M = ((40, 16), (111, 32), (767, 64), (1 << 62, 128))


def default_config_terms(hw, fused_moe_config: str):
    """(share of peak bandwidth, fixed seconds per MoE layer) of the routed experts under vLLM's default
    fused-MoE tiles, or None under a tuned configuration (the experts then stream at `bw_efficiency`)."""
    if fused_moe_config != "default":
        return None
    share, floor = hw.fused_moe_default_bw_efficiency, hw.fused_moe_default_floor
    if share is None or floor is None:
        raise ValueError(f"serving_engine.fused_moe_config=default: hardware '{hw.name}' has no measurement of "
                         "vLLM's default fused-MoE tiles (hardware.fused_moe_default_bw_efficiency and "
                         "hardware.fused_moe_default_floor are null); set both, or use fused_moe_config=tuned")
    return share, floor


def fused_moe_block_m(tokens: int, experts: int = 0, default_tiles: bool = False) -> int:
    """The fused-MoE kernel's row tile for a batch of `tokens` tokens: the tuned configuration's
    (FUSED_MOE_BLOCK_M), or with `default_tiles` vLLM's get_default_config's (16 rows up to one token
    per expert, else 64)."""
    if default_tiles:
        return 16 if tokens <= experts else 64
    return next(rows for largest, rows in FUSED_MOE_BLOCK_M if tokens <= largest)


def padded_pairs(tokens: int, experts: int, top_k: int, block_m: int) -> float:
    """Expected token-expert rows the fused-MoE kernel computes: each expert's count, Binomial(tokens,
    top_k / experts) under uniform routing, padded up to a multiple of `block_m` (moe_align_block_size)."""
    if tokens <= 0 or experts <= 0:
        return 0.0
    p = min(1.0, top_k / experts)
    if p >= 1.0:
        return experts * -(-tokens // block_m) * block_m
    mean, sd = tokens * p, sqrt(tokens * p * (1 - p))
    lo, hi = max(0, int(mean - 12 * sd) - 1), min(tokens, int(mean + 12 * sd) + 2)
    base, lp, lq = lgamma(tokens + 1), log(p), log(1 - p)
    rows = sum(exp(base - lgamma(j + 1) - lgamma(tokens - j + 1) + j * lp + (tokens - j) * lq) * -(-j // block_m)
               for j in range(max(lo, 1), hi + 1))
    return experts * block_m * rows


def experts_touched(tokens: int, experts: int, top_k: int) -> float:
    """Expected distinct experts that `tokens` tokens' top-k choices touch."""
    if tokens <= 0 or experts <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def expert_gemm_terms(tokens: int, hidden: int, width: int, experts: int, top_k: int, dtype_bytes: int,
                      weight_bytes=None, fused_tiles: bool = False, default_tiles: bool = False):
    """(FLOPs, bytes) of the two grouped expert GEMMs for `tokens` tokens (one GPU's shard of width);
    `weight_bytes` per expert weight (default: `dtype_bytes`, the activations'); `fused_tiles`: the
    FLOPs of the fused-MoE kernel's padded row tiles, `default_tiles` its untuned ones (module doc)."""
    touched = experts_touched(tokens, experts, top_k)
    pairs = tokens * top_k
    rows = (padded_pairs(tokens, experts, top_k, fused_moe_block_m(tokens, experts, default_tiles))
            if fused_tiles else pairs)
    flops = 2.0 * rows * hidden * 3 * width
    weights = touched * 3 * hidden * width
    activations = pairs * (hidden + 2 * width) + pairs * (width + hidden)    # in and out of each GEMM
    if weight_bytes is None or weight_bytes == dtype_bytes:
        return flops, (weights + activations) * dtype_bytes
    return flops, weights * weight_bytes + activations * dtype_bytes
