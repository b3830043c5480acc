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
"""
from __future__ import annotations


def experts_touched(tokens: int, experts: int, top_k: int) -> float:
    """Expected distinct experts that `tokens` tokens' top-k choices touch."""
    if tokens <= 0 or experts <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def expert_gemm_terms(tokens: int, hidden: int, width: int, experts: int, top_k: int, dtype_bytes: int,
                      weight_bytes=None):
    """(FLOPs, bytes) of the two grouped expert GEMMs for `tokens` tokens (one GPU's shard of width);
    `weight_bytes` per expert weight (default: `dtype_bytes`, the activations')."""
    touched = experts_touched(tokens, experts, top_k)
    pairs = tokens * top_k
    flops = 2.0 * pairs * hidden * 3 * width
    weights = touched * 3 * hidden * width
    activations = pairs * (hidden + 2 * width) + pairs * (width + hidden)    # in and out of each GEMM
    if weight_bytes is None or weight_bytes == dtype_bytes:
        return flops, (weights + activations) * dtype_bytes
    return flops, weights * weight_bytes + activations * dtype_bytes
