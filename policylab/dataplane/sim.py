"""Simulated data plane: step time from a roofline cost model of the batch (DESIGN §5).

No model runs. Each step costs the larger of its compute time and its memory time,
separately for the dense layers (weights read once per step, 2·params FLOPs per token)
and for attention (KV read per request, FLOPs growing with chunk × context), plus a
fixed per-step overhead. Sampled tokens are deterministic ids, so the engine path is
identical to a real run. A fitted calibration (see `policylab.dataplane.fitted`) can replace the
roofline with a model measured on the real data plane.
"""
from __future__ import annotations

import math

import numpy as np

from policylab.core.config import DataplaneConfig, HardwareConfig, ModelConfig
from policylab.core.batch import Batch, StepResult
from policylab.core.rng import splitmix64

MIN_VOCAB = 32    # ids 0..15 and the top 16 are left out of sampled ids (special tokens)


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


def check_cost_parameters(model: ModelConfig, hw: HardwareConfig, dp: DataplaneConfig) -> None:
    """Refuse parameters that would give a step a duration that is not finite and >= 0 (a NaN
    step_overhead hung the virtual clock; mem_bandwidth=0 divided by zero)."""
    for name in ("peak_flops", "mem_bandwidth", "mem_bytes", "flops_efficiency", "bw_efficiency"):
        value = getattr(hw, name)
        if not (isinstance(value, (int, float)) and 0 < value < math.inf):
            raise ValueError(f"hardware.{name} must be a finite number > 0, got {value!r}")
    if not (isinstance(hw.step_overhead, (int, float)) and 0 <= hw.step_overhead < math.inf):
        raise ValueError(f"hardware.step_overhead must be a finite number >= 0 (seconds), got {hw.step_overhead!r}")
    if not 0 < dp.gpu_memory_utilization <= 1:
        raise ValueError(f"dataplane.gpu_memory_utilization must be in (0, 1], got {dp.gpu_memory_utilization!r}")
    if model.vocab_size <= MIN_VOCAB:
        raise ValueError(f"model.vocab_size must be > {MIN_VOCAB} (sampled ids stay clear of special tokens), "
                         f"got {model.vocab_size}")
    for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "dtype_bytes"):
        if getattr(model, name) < 1:
            raise ValueError(f"model.{name} must be >= 1, got {getattr(model, name)}")


class SimDataPlane:
    def __init__(self, model: ModelConfig, hardware: HardwareConfig, dp: DataplaneConfig, seed: int = 0):
        check_cost_parameters(model, hardware, dp)
        self.shape, self.hw, self.dp, self.seed = ModelShape(model), hardware, dp, seed
        self.vocab_size, self.eos_token_id = model.vocab_size, model.eos_token_id
        self.needs_token_ids = False
        self.calibration = None
        if dp.calibration:
            from policylab.dataplane.fitted import load_calibration
            self.calibration = load_calibration(dp.calibration)
        s, flops = self.shape, hardware.peak_flops * hardware.flops_efficiency
        bw = hardware.mem_bandwidth * hardware.bw_efficiency
        self._s_per_token = 2 * s.dense_params / flops          # the roofline's terms, in seconds
        self._s_per_sample = 2 * s.hidden * s.vocab / flops
        self._s_weights = s.weight_bytes / bw
        self._s_per_attn_pair = 4.0 * s.layers * s.q_dim / flops
        self._s_per_kv_token = s.kv_bytes_per_token / bw
        self._s_overhead = hardware.step_overhead
        self._next_token: list = []          # position -> id sampled after it (see execute)

    def num_kv_blocks(self, block_size: int) -> int:
        free = self.hw.mem_bytes * self.dp.gpu_memory_utilization - self.shape.weight_bytes
        if free <= 0:
            raise ValueError(f"model weights ({self.shape.weight_bytes / 1e9:.1f} GB) do not fit in "
                             f"{self.hw.name} memory x {self.dp.gpu_memory_utilization}")
        return int(free // (self.shape.kv_bytes_per_token * block_size))

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        """Nothing to allocate: the simulated cache is pure accounting."""

    def step_time(self, batch: Batch) -> float:
        """The modelled duration of `batch` (also times real-plane steps: dataplane.step_time=model)."""
        return self._step_time(batch, sum(batch.query_lens), sum(map(bool, batch.sample)))

    def _step_time(self, batch: Batch, tokens: int, sampled: int) -> float:
        q, ctx = batch.query_lens, batch.context_lens
        if self.calibration is not None:
            return self.calibration.predict(np.asarray(q, float), np.asarray(ctx, float))
        dense = self._s_per_token * tokens + self._s_per_sample * sampled
        if dense < self._s_weights:                                      # memory-bound: weights read
            dense = self._s_weights
        context = sum(ctx)
        if tokens == len(q):                                              # decodes only: n = 1
            attn_work = context + tokens                                  # query x key pairs
        else:
            attn_work = sum(n * (c + (n + 1) / 2) for n, c in zip(q, ctx))
        attn = self._s_per_attn_pair * attn_work
        kv = self._s_per_kv_token * (context + 2 * tokens)               # read context, write new
        return dense + (attn if attn > kv else kv) + self._s_overhead

    def execute(self, batch: Batch) -> StepResult:
        """Deterministic ids that depend on the position only, clear of special tokens.

        Lengths come from the trace, not EOS, so ids matter only to the prefix cache: like
        greedy decoding, identical prompts continue identically, and different prompts never
        share an output block (the hash chain carries the prompt). The id sampled after the
        token at position p is `_next_token[p]`, so a decode step costs one C-level pass.
        """
        ctx, tokens = batch.context_lens, sum(batch.query_lens)
        if tokens == len(ctx) and all(batch.sample):     # decodes only: position = context
            positions = ctx
        else:
            positions = [c + n - 1 for c, n, s in zip(ctx, batch.query_lens, batch.sample) if s]
        try:
            ids = list(map(self._next_token.__getitem__, positions))
        except IndexError:
            self._grow_tokens(max(positions) + 1)
            ids = list(map(self._next_token.__getitem__, positions))
        return StepResult(ids, self._step_time(batch, tokens, len(ids)))

    def _grow_tokens(self, size: int) -> None:
        """Extend the id table to cover `size` positions (doubling; each id a hash of seed and position)."""
        have = len(self._next_token)
        size = max(size, 2 * have, 4096)
        ids = splitmix64(self.seed * 0xBF58476D1CE4E5B9, have, size - have) % np.uint64(self.vocab_size - MIN_VOCAB)
        self._next_token += (ids + np.uint64(16)).astype(np.int64).tolist()
