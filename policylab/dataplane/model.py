"""Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM) over a flat, paged batch.

Same math as HF transformers' LlamaForCausalLM (RMSNorm in float32, rotate-half RoPE
with the Llama-3 frequency scaling, GQA, SwiGLU, optional q/k/v bias), but every layer
sees one flat row per scheduled token and reads its context from the paged KV cache.
q/k/v and gate/up projections are fused (one GEMM each) as in vLLM / nano-vLLM.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from policylab.core.config import ModelConfig
from policylab.dataplane.packing import PackedInput


def head_dim_of(cfg: ModelConfig) -> int:
    return cfg.head_dim or cfg.hidden_size // cfg.num_attention_heads


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies; rope_scaling {rope_type: llama3, ...} applies Llama-3.1's smoothing."""
    dim = head_dim_of(cfg)
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    scaling = dict(cfg.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv
    if kind != "llama3":
        raise ValueError(f"model.rope_scaling rope_type '{kind}' is not supported (default, llama3)")
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; cos/sin [T, 1, D] (rotate-half convention, as HF)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.dim = head_dim_of(cfg)
        self.q_size, self.kv_size = self.heads * self.dim, self.kv_heads * self.dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, kv, packed, backend, meta):
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rope(q.view(-1, self.heads, self.dim), cos, sin)
        k = apply_rope(k.view(-1, self.kv_heads, self.dim), cos, sin)
        out = backend.forward(q, k, v.view(-1, self.kv_heads, self.dim), kv[0], kv[1], packed, meta)
        return self.o_proj(out.reshape(-1, self.q_size))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, kv, packed, backend, meta):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv, packed, backend, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class CausalLM(nn.Module):
    """Parameter names follow HF's (model.layers.N...), with q/k/v and gate/up fused."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.model.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.finish_init(torch.device("cpu"))

    def finish_init(self, device: torch.device) -> None:
        """Tie embeddings and place the (float32) RoPE frequencies; again after `to_empty`."""
        if self.cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.inv_freq = rope_inv_freq(self.cfg).to(device)

    def rope(self, positions: torch.Tensor, dtype) -> tuple:
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, packed: PackedInput, kv_caches: list, backend, all_logits: bool = False):
        """Logits [S, vocab] for the sampled rows (or [T, vocab] for every row with all_logits)."""
        meta = backend.plan(packed, kv_caches[0][0].shape)
        x = self.model.embed_tokens(packed.input_ids)
        cos, sin = self.rope(packed.positions, x.dtype)
        for layer, kv in zip(self.model.layers, kv_caches):
            x = layer(x, cos, sin, kv, packed, backend, meta)
        if not all_logits:
            x = x[packed.logits_indices]
        return self.lm_head(self.model.norm(x))
