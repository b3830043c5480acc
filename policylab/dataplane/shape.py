"""Sizes of a model, as one GPU of a tensor-parallel group sees them, that the cost models need.

A dense layer is (K, N) GEMMs — QKV, O, the MLP's up (gate and up for SwiGLU) and down — plus
elementwise traffic. Under tensor parallelism p (Megatron layout) QKV and up are split by
columns and O and down by rows, so each GPU holds 1/p of every GEMM; key/value heads fewer than
p are replicated (ceil(kv_heads / p) per GPU, as vLLM does). Sizes that p does not divide are
rounded up: the GPU with the most heads or columns sets the step's pace. A mixture-of-experts layer keeps the
attention GEMMs and replaces the MLP with a router GEMM, `num_shared_experts` dense experts and
`num_experts` routed ones of which each token uses `num_experts_per_tok`
(`policylab.dataplane.moe` prices them). Multi-head latent attention (DeepSeek) caches one
latent of kv_lora_rank + qk_rope_head_dim per token per layer instead of keys and values per
head; its latent projections are replicated on every GPU, as is its cache.
"""
from __future__ import annotations

from policylab.core.config import ModelConfig
from policylab.dataplane.precision import Precision


class ModelShape:
    """Sizes derived from a model config (per GPU of a `tp`-way group); bytes per weight, KV
    element and activation from `precision` (default: the model's `dtype_bytes` for all three)."""

    def __init__(self, m: ModelConfig, tp: int = 1, precision: Precision | None = None):
        head_dim = m.head_dim or m.hidden_size // m.num_attention_heads
        h, f = m.hidden_size, -(-m.intermediate_size // tp)
        heads = -(-m.num_attention_heads // tp)     # ceil: an uneven split's busiest GPU sets the pace
        kv_heads = -(-m.num_key_value_heads // tp)
        q, kv = heads * head_dim, kv_heads * head_dim
        gated = m.architecture != "phi"           # SwiGLU: gate and up projections, SiLU·mul
        norms = 2 if gated else 1                 # phi: one LayerNorm feeds attention and MLP
        self.mla = m.kv_lora_rank > 0
        if self.mla:
            rope, v_dim = m.qk_rope_head_dim, m.v_head_dim or head_dim
            q_proj = ((h, m.q_lora_rank), (m.q_lora_rank, heads * (head_dim + rope))) if m.q_lora_rank else \
                ((h, heads * (head_dim + rope)),)
            self.attn_gemms = (*q_proj, (h, m.kv_lora_rank + rope), (m.kv_lora_rank, heads * (head_dim + v_dim)),
                               (heads * v_dim, h))
            latent = m.kv_lora_rank + rope
            # absorbed form (as vLLM decodes MLA): scores over the latent + rope part, values over the latent
            self.attn_flops_per_pair = 2 * heads * (latent + m.kv_lora_rank)
            self.kv_elems_per_token_layer = latent
            rope_elems = heads * rope + rope
        else:
            self.attn_gemms = ((h, q + 2 * kv), (q, h))
            self.attn_flops_per_pair = 4 * q
            self.kv_elems_per_token_layer = 2 * kv
            rope_elems = q + kv
        self.mlp_gemms = ((h, (2 if gated else 1) * f), (f, h))
        self.gemms = self.attn_gemms + self.mlp_gemms           # (K, N) of a dense layer
        self.layers, self.q_dim, self.vocab, self.hidden = m.num_hidden_layers, q, m.vocab_size, h
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.tp, self.dtype_bytes = tp, m.dtype_bytes                 # activations, embedding, LM head
        self.precision = precision
        self.weight_elem_bytes = precision.weight_bytes if precision else m.dtype_bytes   # decoder linear layers
        self.kv_elem_bytes = precision.kv_bytes if precision else m.dtype_bytes
        self.moe = m.num_experts > 0
        self.dense_layers = min(m.first_dense_layers, m.num_hidden_layers) if self.moe else m.num_hidden_layers
        self.moe_layers = m.num_hidden_layers - self.dense_layers
        self.experts, self.top_k = m.num_experts, m.num_experts_per_tok
        self.expert_f = -(-m.moe_intermediate_size // tp)      # each expert's width on one GPU (TP-sharded)
        shared_f = -(-(m.num_shared_experts * m.moe_intermediate_size) // tp)
        self.moe_gemms = self.attn_gemms + ((h, m.num_experts),) + (
            ((h, 2 * shared_f), (shared_f, h)) if shared_f else ())
        expert_params = m.num_experts * 3 * h * self.expert_f
        self.dense_params = (self.dense_layers * sum(k * n for k, n in self.gemms)
                             + self.moe_layers * (sum(k * n for k, n in self.moe_gemms) + expert_params))
        embed = m.vocab_size * h
        self.weight_bytes = (self.dense_params * self.weight_elem_bytes
                             + embed * (1 if m.tie_word_embeddings else 2) * m.dtype_bytes)
        if tp > 1:      # the whole group's weights (the replicated parts counted once)
            self.weight_bytes = ModelShape(m, 1, precision).weight_bytes
        self.kv_bytes_per_token = m.num_hidden_layers * self.kv_elems_per_token_layer * self.kv_elem_bytes
        # elements read + written per token per layer: norms (h in, h out), RoPE (q and k in and
        # out), the activation (SiLU·mul: 2f in, f out; GELU: f in, f out), 2 residual adds (2h in, h out)
        self.residual_add_elems = 2 * 3 * h
        self.elementwise_elems = norms * 2 * h + 2 * rope_elems + (3 if gated else 2) * f + self.residual_add_elems
        routed_f = m.num_experts_per_tok * self.expert_f + shared_f
        self.moe_elementwise_elems = norms * 2 * h + 2 * rope_elems + 3 * routed_f + self.residual_add_elems
        self.norms = norms
        self.elementwise_kernels = norms + 1 + 1 + 2                           # norms, RoPE, activation, adds
        self.kernels_per_layer = len(self.gemms) + self.elementwise_kernels
        # MoE layer: attention GEMMs, router, top-k + permute, two grouped expert GEMMs, shared experts
        self.moe_kernels_per_layer = len(self.moe_gemms) + 2 + 2 + norms + 1 + 1 + 2

    def gemm_bytes(self, n: int, k: int, m: int):
        """Memory traffic of an n x k by k x m GEMM: its weights once, activations in and out."""
        return k * m * self.weight_elem_bytes + n * (k + m) * self.dtype_bytes

    def kv_bytes_per_token_all_gpus(self) -> int:
        """KV bytes one token takes summed over the group (replicated heads or latent counted per GPU)."""
        return self.kv_bytes_per_token * self.tp
