"""The default cost model of the sim data plane: a roofline of the model's shape on a GPU spec.

Each GEMM of a layer costs its compute time (2·n·K·N FLOPs at `flops_efficiency` of peak)
and its memory time (weights once, activations in and out, at `bw_efficiency` of peak
bandwidth), joined by a p-norm `(tc^p + tm^p)^(1/p)` instead of `max(tc, tm)`:

- far from the knee the larger term wins, as in the roofline (a 1-token GEMM streams its
  weights; a 16k-token one is FLOP-bound);
- at the knee a pipelined kernel hits neither bound: loads and tensor-core work overlap only
  partly. On Vidur's A100 Llama-3-8B profile (`a100/meta-llama/Meta-Llama-3-8B`) the GEMMs take 1.3-1.4x
  the larger bound where the two are equal, which is 2^(1/p) for p ≈ 2-3. Over all 20 of Vidur's
  profiles (8 models on the A100, A40 and H100), p = 3 has the smallest worst error at the
  powers of two of p in {2, 2.5, 3, 4, 6} on each GPU (11 / 15 / 18 %; p = 2: 23-25 %), its
  median within a point of p = 2's (experiments/check_roofline_profiles.py). A sum (p = 1)
  would double the time at the knee; a max (p = ∞) is 22-38 % short at 128-256 tokens there.

Every kernel also costs `kernel_latency` (~5 µs on all three GPUs), however small: launch,
pipeline fill and the last wave's tail. Without it one bandwidth cannot fit weight streaming
across model sizes: Vidur's 1-token GEMMs reach 0.46-0.81 of the A100's peak bandwidth by
size, and 4.9 µs + bytes / (0.79 x peak) fits all 160 of them within 4 % rms
(experiments/measure_gpu_efficiencies.py).

Elementwise ops (the RMSNorms, RoPE on q and k, SiLU·mul, two residual adds) are memory
traffic per token per layer plus one kernel each; the embedding is a gather of the scheduled
tokens' rows, not a read of the table; the LM head runs for sampled tokens only. Attention is
one kernel per layer that reads each request's KV once and does 4·q_dim FLOPs per query-key
pair, joined the same way. `architecture: phi` is phi-2's block: a GELU MLP (one up
projection), one LayerNorm feeding attention and MLP in parallel.
No term is tuned to one file: the only per-GPU numbers are the two efficiencies and the kernel
latency (and `step_overhead`), measured per regime and given with their source in
configs/hardware/*.yaml.
"""
from __future__ import annotations

from operator import mul

from policylab.core.config import HardwareConfig, ModelConfig

P_NORM = 3.0      # knee sharpness (see above): 2^(1/3) = 1.26x the larger bound at balance


def smooth_max(a: float, b: float) -> float:
    """p-norm of two times: the roofline's max with the partial overlap of a real kernel."""
    return (a ** P_NORM + b ** P_NORM) ** (1 / P_NORM)


class ModelShape:
    """Sizes derived from a model config that the cost models need."""

    def __init__(self, m: ModelConfig):
        head_dim = m.head_dim or m.hidden_size // m.num_attention_heads
        h, f = m.hidden_size, m.intermediate_size
        q, kv = m.num_attention_heads * head_dim, m.num_key_value_heads * head_dim
        gated = m.architecture != "phi"           # SwiGLU: gate and up projections, SiLU·mul
        norms = 2 if gated else 1                 # phi: one LayerNorm feeds attention and MLP
        self.gemms = ((h, q + 2 * kv), (q, h), (h, (2 if gated else 1) * f), (f, h))   # (K, N): QKV, O, up, down
        self.layers, self.q_dim, self.vocab, self.hidden = m.num_hidden_layers, q, m.vocab_size, h
        self.dtype_bytes = m.dtype_bytes
        self.dense_params = m.num_hidden_layers * sum(k * n for k, n in self.gemms)
        embed = m.vocab_size * h
        self.weight_bytes = (self.dense_params + embed * (1 if m.tie_word_embeddings else 2)) * m.dtype_bytes
        self.kv_bytes_per_token = 2 * m.num_hidden_layers * kv * m.dtype_bytes
        # elements read + written per token per layer: norms (h in, h out), RoPE (q and k in and
        # out), the activation (SiLU·mul: 2f in, f out; GELU: f in, f out), 2 residual adds (2h in, h out)
        self.elementwise_elems = norms * 2 * h + 2 * (q + kv) + (3 if gated else 2) * f + 2 * 3 * h
        self.kernels_per_layer = len(self.gemms) + norms + 1 + 1 + 2          # + RoPE, activation, adds


class Roofline:
    """Step time of a batch from the shape and the hardware (seconds); dense part cached per token count."""

    def __init__(self, model: ModelConfig, hw: HardwareConfig):
        self.shape = s = ModelShape(model)
        self.flops = hw.peak_flops * hw.flops_efficiency
        self.bw = hw.mem_bandwidth * hw.bw_efficiency
        self.latency = hw.kernel_latency
        self.overhead = hw.step_overhead
        self.hw_name, self.flops_eff, self.bw_eff = hw.name, hw.flops_efficiency, hw.bw_efficiency
        self._s_per_attn_pair = 4.0 * s.layers * s.q_dim / self.flops
        self._s_per_kv_token = s.kv_bytes_per_token / self.bw
        self._dense: dict = {}
        self._lm_head: dict = {}

    def layers_time(self, n: int) -> float:
        """All transformer layers' GEMMs and elementwise ops for n tokens (no attention)."""
        s, b = self.shape, self.shape.dtype_bytes
        gemm = sum(smooth_max(2 * n * k * m / self.flops, (k * m + n * (k + m)) * b / self.bw) for k, m in s.gemms)
        return s.layers * (gemm + n * s.elementwise_elems * b / self.bw + s.kernels_per_layer * self.latency)

    def embedding_time(self, n: int) -> float:
        """A gather: n rows read and written."""
        return self.latency + 2 * n * self.shape.hidden * self.shape.dtype_bytes / self.bw

    def lm_head_time(self, sampled: int) -> float:
        t = self._lm_head.get(sampled)
        if t is None:
            s, b = self.shape, self.shape.dtype_bytes
            compute = 2 * sampled * s.hidden * s.vocab / self.flops
            memory = (s.hidden * s.vocab + sampled * (s.hidden + s.vocab)) * b / self.bw
            t = self._lm_head[sampled] = self.latency + smooth_max(compute, memory) if sampled else 0.0
        return t

    def dense_time(self, tokens: int) -> float:
        """Kernel time of everything but attention and the LM head (what a Vidur mlp.csv measures)."""
        t = self._dense.get(tokens)
        if t is None:
            t = self._dense[tokens] = self.layers_time(tokens) + self.embedding_time(tokens)
        return t

    def attention_time(self, q, ctx, tokens: int) -> float:
        """All layers' attention: one kernel per layer over the batch's query-key pairs and KV reads."""
        context = sum(ctx)
        if tokens == len(q):                                              # decodes only: n = 1
            pairs = context + tokens                                      # query x key pairs
        else:
            # sum of n·(c + (n+1)/2): integers, so as C-level sums of products (exactly the same value)
            pairs = sum(map(mul, q, ctx)) + (sum(map(mul, q, q)) + tokens) // 2
        return (self.shape.layers * self.latency
                + smooth_max(self._s_per_attn_pair * pairs, self._s_per_kv_token * (context + 2 * tokens)))

    def step_time(self, q, ctx, tokens: int, sampled: int) -> float:
        dense, head = self._dense.get(tokens), self._lm_head.get(sampled)     # (every step: the cached
        if dense is None:                                                     # parts without a call)
            dense = self.dense_time(tokens)
        if head is None:
            head = self.lm_head_time(sampled)
        return dense + head + self.attention_time(q, ctx, tokens) + self.overhead

    def describe(self) -> dict:
        return {"kind": "roofline", "hardware": self.hw_name, "flops_efficiency": self.flops_eff,
                "bw_efficiency": self.bw_eff, "kernel_latency": self.latency, "step_overhead": self.overhead,
                "p_norm": P_NORM}
