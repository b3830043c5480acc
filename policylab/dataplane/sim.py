"""Simulated data plane: step time from a roofline cost model of the batch (DESIGN §5).

No model runs. Each step costs the larger of its compute time and its memory time,
separately for the dense layers (weights read once per step, 2·params FLOPs per token)
and for attention (KV read per request, FLOPs growing with chunk × context), plus a
fixed per-step overhead. Sampled tokens are deterministic ids, so the engine path is
identical to a real run. A fitted calibration (see `policylab.calibrate`) can replace the
roofline with a model measured on the real data plane.
"""
from __future__ import annotations

import numpy as np

from policylab.config import DataplaneConfig, HardwareConfig, ModelConfig
from policylab.dataplane.base import Batch, StepResult


class ModelShape:
    """Sizes derived from a model config that the cost model needs."""

    def __init__(self, m: ModelConfig):
        head_dim = m.head_dim or m.hidden_size // m.num_attention_heads
        q, kv = m.num_attention_heads * head_dim, m.num_key_value_heads * head_dim
        per_layer = m.hidden_size * (q + 2 * kv) + q * m.hidden_size + 3 * m.hidden_size * m.intermediate_size
        self.layers, self.q_dim, self.vocab = m.num_hidden_layers, q, m.vocab_size
        self.hidden = m.hidden_size
        self.dense_params = m.num_hidden_layers * per_layer
        embed = m.vocab_size * m.hidden_size
        self.weight_bytes = (self.dense_params + embed * (1 if m.tie_word_embeddings else 2)) * m.dtype_bytes
        self.kv_bytes_per_token = 2 * m.num_hidden_layers * kv * m.dtype_bytes


class SimDataPlane:
    def __init__(self, model: ModelConfig, hardware: HardwareConfig, dp: DataplaneConfig, seed: int = 0):
        self.shape, self.hw, self.dp, self.seed = ModelShape(model), hardware, dp, seed
        self.vocab_size, self.eos_token_id = model.vocab_size, model.eos_token_id
        self.needs_token_ids = False
        self.calibration = None
        if dp.calibration:
            from policylab.calibrate import load_calibration
            self.calibration = load_calibration(dp.calibration)

    def num_kv_blocks(self, block_size: int) -> int:
        free = self.hw.mem_bytes * self.dp.gpu_memory_utilization - self.shape.weight_bytes
        if free <= 0:
            raise ValueError(f"model weights ({self.shape.weight_bytes / 1e9:.1f} GB) do not fit in "
                             f"{self.hw.name} memory x {self.dp.gpu_memory_utilization}")
        return int(free // (self.shape.kv_bytes_per_token * block_size))

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        """Nothing to allocate: the simulated cache is pure accounting."""

    def step_time(self, batch: Batch) -> float:
        return self._step_time(batch, sum(batch.query_lens), sum(batch.sample))

    def _step_time(self, batch: Batch, tokens: int, sampled: int) -> float:
        q, ctx = batch.query_lens, batch.context_lens
        if self.calibration is not None:
            return self.calibration.predict(np.asarray(q, float), np.asarray(ctx, float))
        s, hw = self.shape, self.hw
        flops = hw.peak_flops * hw.flops_efficiency
        bw = hw.mem_bandwidth * hw.bw_efficiency
        dense = max((2 * s.dense_params * tokens + 2 * s.hidden * s.vocab * sampled) / flops,
                    s.weight_bytes / bw)
        context = sum(ctx)
        if tokens == len(q):                                              # decodes only: n = 1
            attn_work = context + tokens                                  # query x key pairs
        else:
            attn_work = sum(n * (c + (n + 1) / 2) for n, c in zip(q, ctx))
        kv_tokens = context + 2 * tokens                                 # read context, write new
        return (dense + max(4.0 * s.layers * s.q_dim * attn_work / flops,
                            s.kv_bytes_per_token * kv_tokens / bw) + hw.step_overhead)

    def execute(self, batch: Batch) -> StepResult:
        """Deterministic ids clear of special tokens (lengths come from the trace, not EOS)."""
        salt, span = self.seed * 2246822519, self.vocab_size - 32
        ids = [16 + ((rid * 2654435761 + (ctx + n) * 40503 + salt) & 0xFFFFFFFF) % span
               for rid, n, ctx, s in zip(batch.req_ids, batch.query_lens, batch.context_lens, batch.sample)
               if s]
        return StepResult(ids, self._step_time(batch, sum(batch.query_lens), len(ids)))
