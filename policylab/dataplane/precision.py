"""Precision as configuration: the dtypes of the weights, the KV cache and the GEMMs' compute.

Three keys of a data plane (`dataplane.weight_dtype`, `dataplane.kv_cache_dtype`,
`dataplane.compute_dtype`; presets `quant=fp8|int8|w8a16|w4a16`, `kv_dtype=fp8`) say what a
serving engine would run:

| weights | compute | what it is (vLLM's name) | GEMM peak | weight bytes |
|---|---|---|---|---|
| bf16 / fp16 | bf16 / fp16 | unquantised | `peak_flops` | 2 |
| fp8 | fp8 | W8A8 FP8 (`--quantization fp8`), per-token activation scales | `peak_flops_fp8` | 1 |
| int8 | int8 | W8A8 INT8 (SmoothQuant-style, compressed-tensors) | `peak_flops_int8` | 1 |
| int8 / fp8 | bf16 | W8A16, weight-only (Marlin) | `peak_flops` + dequantisation | 1 |
| int4 | bf16 | W4A16, weight-only, group 128 (GPTQ/AWQ on Marlin) | `peak_flops` + dequantisation | 0.5 + scales |

`auto` keeps the model's own `dtype_bytes` for weights, KV and activations at the BF16 peak:
every number the cost models gave before precision existed (the replay digests check it).

Only the decoder layers' linear layers are quantised; the embedding and the LM head stay at the
activation dtype (vLLM quantises every Linear but `lm_head`), and so do the activations between
kernels, the norms and the all-reduces. Attention FLOPs stay at the BF16 peak (FlashAttention
dequantises an FP8 KV cache to BF16 before its matmuls).

A weight-only GEMM streams fewer bytes where it is memory-bound (decode) and pays for unpacking
every weight tile where it is compute-bound: Marlin reaches the ideal 3.87x at batch 16-32 and
runs ~10 % slower than FP16 on 1,024-token-and-larger GEMMs (Frantar et al., "MARLIN: Mixed-Precision
Auto-Regressive Parallel Inference on Large Language Models", arXiv 2408.11743), so its compute
term is `1 + WEIGHT_ONLY_DEQUANT_OVERHEAD` times the BF16 one. INT4 weights carry one FP16 scale per
`INT4_GROUP` weights: 4.125 bits a weight, the 3.88x of Marlin's ideal.

A GPU without FP8 (INT8) tensor cores refuses `compute_dtype=fp8` (`int8`) with one line, naming
the weight-only fallback vLLM itself uses there (FP8 Marlin on Ampere).
"""
from __future__ import annotations

from dataclasses import dataclass

from policylab.core.config import HardwareConfig, ModelConfig

INT4_GROUP = 128                     # weights per FP16 scale (GPTQ/AWQ checkpoints' group size)
WEIGHT_ONLY_DEQUANT_OVERHEAD = 0.10  # compute-bound W4A16/W8A16 GEMMs vs BF16 (Marlin, arXiv 2408.11743)
BYTES = {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5 + 2.0 / INT4_GROUP}
WEIGHT_DTYPES = ("auto", "bf16", "fp16", "fp8", "int8", "int4")
KV_DTYPES = ("auto", "bf16", "fp16", "fp8")
COMPUTE_DTYPES = ("auto", "bf16", "fp16", "fp8", "int8")


@dataclass(frozen=True)
class Precision:
    """What the cost models read: bytes per weight, per KV element and per activation element,
    the GEMMs' FLOP rate relative to the BF16 peak, and the names (summary.json)."""
    weight_dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    compute_dtype: str = "auto"
    weight_bytes: float = 2          # per parameter of the decoder layers' linear layers
    kv_bytes: float = 2              # per cached K or V element
    act_bytes: float = 2             # activations, embedding, LM head
    gemm_speedup: float = 1.0        # GEMM compute peak / the BF16 peak (x the dequantisation)

    @property
    def native(self) -> bool:
        """All three `auto`: the model's own dtype everywhere (the cost models' former numbers)."""
        return self.weight_dtype == self.kv_cache_dtype == self.compute_dtype == "auto"

    def describe(self) -> dict:
        return {"weight_dtype": self.weight_dtype, "kv_cache_dtype": self.kv_cache_dtype,
                "compute_dtype": self.compute_dtype, "weight_bytes": self.weight_bytes,
                "kv_bytes": self.kv_bytes, "gemm_speedup": self.gemm_speedup}


def check_names(weight: str, kv: str, compute: str) -> None:
    """Unknown dtypes and combinations no engine runs, refused naming the key."""
    for key, value, allowed in (("weight_dtype", weight, WEIGHT_DTYPES), ("kv_cache_dtype", kv, KV_DTYPES),
                                ("compute_dtype", compute, COMPUTE_DTYPES)):
        if value not in allowed:
            raise ValueError(f"dataplane.{key} must be one of {', '.join(allowed)}, got '{value}'")
    if compute in ("fp8", "int8") and weight != compute:
        raise ValueError(f"dataplane.compute_dtype={compute} is W8A8: it needs dataplane.weight_dtype={compute} "
                         f"(got '{weight}'; quant={compute} sets both)")


def resolve_precision(model: ModelConfig, hw: HardwareConfig, weight: str = "auto", kv: str = "auto",
                      compute: str = "auto") -> Precision:
    """The precision the keys name on this GPU; a dtype the GPU cannot compute in is refused."""
    check_names(weight, kv, compute)
    native = float(model.dtype_bytes)
    if weight == kv == compute == "auto":
        return Precision(weight_bytes=model.dtype_bytes, kv_bytes=model.dtype_bytes, act_bytes=model.dtype_bytes)
    speedup = 1.0
    if compute in ("fp8", "int8"):
        peak = hw.peak_flops_fp8 if compute == "fp8" else hw.peak_flops_int8
        if not peak:
            fallback = "W8A16 (FP8 Marlin, as vLLM on Ampere)" if compute == "fp8" else "W8A16"
            raise ValueError(f"hardware {hw.name} has no {compute.upper()} tensor cores: compute_dtype={compute} "
                             f"cannot run there; dataplane.compute_dtype=bf16 runs {weight} weights as {fallback}")
        speedup = peak / hw.peak_flops
    elif weight in ("fp8", "int8", "int4"):
        speedup = 1.0 / (1.0 + WEIGHT_ONLY_DEQUANT_OVERHEAD)
    return Precision(weight, kv, compute,
                     weight_bytes=native if weight == "auto" else BYTES[weight],
                     kv_bytes=native if kv == "auto" else BYTES[kv],
                     act_bytes=native, gemm_speedup=speedup)


def plane_precision(model: ModelConfig, hw: HardwareConfig, dp) -> Precision:
    """The precision a plane config (any with the three keys; others: `auto`) names."""
    return resolve_precision(model, hw, getattr(dp, "weight_dtype", "auto"), getattr(dp, "kv_cache_dtype", "auto"),
                             getattr(dp, "compute_dtype", "auto"))
