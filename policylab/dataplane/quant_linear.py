"""Quantised linear layers of the real data plane (`dataplane=torch dataplane.weight_dtype=...`).

The decoder layers' four linear layers (fused QKV, O, fused gate/up, down) keep their weights
quantised in memory, as a serving engine's checkpoint holds them; the embedding, the LM head and
the norms stay at the plane's dtype (vLLM quantises every Linear but `lm_head`):

- `int8`: one symmetric scale per output channel (amax / 127);
- `fp8`: E4M3 with one scale per output channel (amax / 448);
- `int4`: symmetric, one scale per group of 128 input weights (amax / 7; 64, 32 or 16 where 128
  does not divide the width), two weights a byte (GPTQ/AWQ's layout without their error-correcting
  rounding).

Each step dequantises the weight for the matmul (torch's CPU INT8-weight kernel,
`aten._weight_int8pack_mm`, is a GEMV: 30x slower than this at 128 rows). The numbers are the
quantised ones; the plane's step *time* is the cost model's (`dataplane.step_time=model`), which
prices the precision as a GPU's kernels run it.

`compute_dtype=int8|fp8` (W8A8) also quantises each token's activations before the matmul with
one dynamic scale per token (amax / 127 or / 448), exactly what an INT8 GEMM with INT32
accumulation computes (the products of 8-bit integers are exact in float32 below 2^24).
Round-to-nearest throughout: what a precision costs here is the plain rounding, an upper bound
on what calibrated checkpoints (GPTQ, AWQ, SmoothQuant) lose.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
TINY = 1e-12
LAYER_LINEARS = (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"), ("mlp", "down_proj"))
TORCH_WEIGHT_DTYPES = ("auto", "int8", "fp8", "int4")
TORCH_KV_DTYPES = ("auto", "fp8")
TORCH_COMPUTE_DTYPES = ("auto", "int8", "fp8")


def int4_group(in_features: int, preferred: int = 128) -> int:
    """The largest of 128, 64, 32, 16 that divides the input width (GPTQ/AWQ use 128)."""
    for g in (preferred, 64, 32, 16):
        if in_features % g == 0:
            return g
    raise ValueError(f"weight_dtype=int4 needs an input width divisible by 16, got {in_features}")


def quantize_tokens(x: torch.Tensor, kind: str) -> torch.Tensor:
    """x with each row (token) rounded to INT8 or FP8 at its own scale, back in x's dtype."""
    amax = x.abs().amax(-1, keepdim=True).float().clamp(min=TINY)
    if kind == "int8":
        s = amax / 127.0
        return (torch.round(x.float() / s).clamp(-127, 127) * s).to(x.dtype)
    s = amax / FP8_MAX
    return ((x.float() / s).to(FP8).float() * s).to(x.dtype)


class QuantLinear(nn.Module):
    """A linear layer whose weight is stored quantised (module doc)."""

    def __init__(self, linear: nn.Linear, weight_dtype: str, compute_dtype: str = "auto"):
        super().__init__()
        w = linear.weight.detach().float()
        self.out_features, self.in_features = w.shape
        self.weight_dtype, self.compute_dtype, self.dtype = weight_dtype, compute_dtype, linear.weight.dtype
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        if weight_dtype == "int4":
            self.group = int4_group(self.in_features)
            groups = w.view(self.out_features, -1, self.group)
            scale = groups.abs().amax(-1, keepdim=True).clamp(min=TINY) / 7.0
            q = (torch.round(groups / scale).clamp(-8, 7) + 8).to(torch.uint8).view(self.out_features, -1)
            self.register_buffer("qweight", q[:, 0::2] | (q[:, 1::2] << 4))     # two weights a byte
            self.register_buffer("scale", scale.squeeze(-1))                      # [out, in / group]
            return
        amax = w.abs().amax(1, keepdim=True).clamp(min=TINY)
        if weight_dtype == "int8":
            scale = amax / 127.0
            self.register_buffer("qweight", torch.round(w / scale).clamp(-127, 127).to(torch.int8))
        elif weight_dtype == "fp8":
            scale = amax / FP8_MAX
            self.register_buffer("qweight", (w / scale).to(FP8))
        else:
            raise ValueError(f"dataplane.weight_dtype={weight_dtype}: the real plane stores int8, fp8 or int4 weights")
        self.register_buffer("scale", scale.squeeze(1))                           # [out]

    def dequantized(self) -> torch.Tensor:
        """The weight as the matmul sees it ([out, in], the plane's dtype)."""
        if self.weight_dtype == "int4":
            q = self.qweight
            unpacked = torch.stack(((q & 0xF), (q >> 4)), -1).view(self.out_features, -1).float() - 8
            w = unpacked.view(self.out_features, -1, self.group) * self.scale.unsqueeze(-1)
            return w.view(self.out_features, self.in_features).to(self.dtype)
        return (self.qweight.float() * self.scale.unsqueeze(1)).to(self.dtype)

    def weight_bytes(self) -> int:
        return self.qweight.numel() * self.qweight.element_size() + self.scale.numel() * self.scale.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.compute_dtype in ("int8", "fp8"):
            x = quantize_tokens(x, self.compute_dtype)
        return F.linear(x, self.dequantized(), self.bias)


def check_torch_precision(weight: str, kv: str, compute: str) -> None:
    """The dtypes the real plane implements (one line for any other)."""
    for key, value, allowed in (("weight_dtype", weight, TORCH_WEIGHT_DTYPES), ("kv_cache_dtype", kv, TORCH_KV_DTYPES),
                                ("compute_dtype", compute, TORCH_COMPUTE_DTYPES)):
        if value not in allowed:
            raise ValueError(f"dataplane.{key}={value}: the real plane runs {', '.join(allowed)} "
                             "(its 16-bit dtype is dataplane.dtype)")
    if compute != "auto" and weight != compute:
        raise ValueError(f"dataplane.compute_dtype={compute} is W8A8: it needs dataplane.weight_dtype={compute} "
                         f"(got '{weight}'; quant={compute} sets both)")


def quantize_model(model: nn.Module, weight_dtype: str, compute_dtype: str = "auto") -> int:
    """Replace the decoder layers' linear layers by QuantLinear; the bytes their weights now take."""
    total = 0
    for layer in model.model.layers:
        for block, name in LAYER_LINEARS:
            parent = getattr(layer, block)
            q = QuantLinear(getattr(parent, name), weight_dtype, compute_dtype)
            setattr(parent, name, q)
            total += q.weight_bytes()
    return total
