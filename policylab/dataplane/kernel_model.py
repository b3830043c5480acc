"""`dataplane.cost_model=kernel`: the roofline with GEMM and attention kernels priced by shape.

Two terms of the default roofline are replaced; everything else (elementwise traffic, the
embedding, the LM head, TP collectives, pipeline stages, host time, MoE experts) is shared.

GEMMs: an m x K by K x N GEMM runs as ceil(m/tm) x ceil(N/tn) output tiles over `num_sms`
SMs, in waves. The tile rows follow m up to `gemm_tile_m` (libraries pick narrow tiles for
few tokens), columns are `gemm_tile_n` or half that, and K may be split in up to 4 parts of at
least 512 (split-K): of these the fastest is taken, as a library's heuristic picks a kernel that
fills the SMs. Compute time is that of the padded tiles, in whole
waves, at `gemm_efficiency` of peak (what a large GEMM that fills every SM reaches):

    t_compute = waves x 2 x tm x tn x (K / splits) / (peak x gemm_efficiency / num_sms)

so efficiency rises with m in steps (wave quantisation) instead of being one number. On a GPU
whose preset sets `persistent_gemm_efficiency` (H100, H200: cuBLAS's and CUTLASS's persistent,
warp-specialised kernels with a tile scheduler), work items of at least one full wave run at that
share of peak with no step at a wave boundary (waves = items / num_sms), in every serving engine
whose library runs them (`serving_engine.persistent_gemms`: current libraries, `none` included;
not `vidur` and `eager_nccl`, whose older library steps at wave boundaries). Memory
time is the roofline's (weights, activations in and out at `bw_efficiency`); the two join by
the roofline's p-norm (on Vidur's 20 profiles p = 3 has a smaller worst error than a max:
21 % against 28 %, experiments/check_roofline_profiles.py --cost-model kernel).

Attention (one kernel per layer per phase, as vLLM launches FlashAttention varlen for prefill
chunks and a paged kernel for decodes): each costs `attention_floor` plus the larger of

- FLOPs: scores and values over the query-key pairs the causal tiles touch (128 x 128 tiles:
  a 100-token chunk costs a whole tile), at `attention_efficiency` of peak, scaled by how many
  of the SMs the (query tile x head) work items fill;
- bytes: Q read, O written, K and V read once per request, and the new tokens' K and V written
  to the paged cache (the cache-write kernel is one more launch), at `bw_efficiency`.

Decode kernels split the KV sequence over the SMs (flash-decoding), so even one short request
streams at full bandwidth: on vLLM's published decode benchmark (PR #43232, FLASH_ATTN, 1-16
requests x 1k-32k tokens) the time is 11 us + bytes / bandwidth within ~10 %, where a floor
taken as a max (no increment below it) is 50 % short at 16k tokens.

The per-step cost stays O(prefill chunks): the decode part is computed from sums the roofline
already takes.
"""
from __future__ import annotations

from itertools import compress

from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.roofline import Roofline, smooth_max

ATTN_TILE = 128          # FlashAttention-2/3 query and key tile (head_dim 128)
MIN_TILE_M = 16          # the narrowest tile rows a GEMM library launches
SPLIT_K_MIN = 512        # the least K one split of a split-K GEMM keeps
MAX_SPLITS = 4           # split-K factors tried
HALF_TILE_RATE = 0.95    # a tile half as wide runs at this share of a full tile's FLOP rate (assumed)


class KernelCostModel(Roofline):
    """The roofline with shape-aware GEMM and attention kernels (module doc); its steps take the
    roofline's path (the general one with parallelism or per-request / per-token host time)."""

    def __init__(self, model: ModelConfig, hw: HardwareConfig, tp: int = 1, pp: int = 1, engine=None,
                 precision=None):
        super().__init__(model, hw, tp, pp, engine, precision)
        self.sms, self.tile_m, self.tile_n = hw.num_sms, hw.gemm_tile_m, hw.gemm_tile_n
        self.gemm_eff, self.attn_eff, self.floor = hw.gemm_efficiency, hw.attention_efficiency, hw.attention_floor
        self._tile_flops = hw.peak_flops * hw.gemm_efficiency / hw.num_sms       # FLOP/s of one SM
        # persistent GEMMs from one full wave up, where the GPU has a level and the engine's library runs them
        self.persistent_eff = hw.persistent_gemm_efficiency if self.engine.cfg.persistent_gemms else None
        self._persistent_tile_flops = (hw.peak_flops * self.persistent_eff / hw.num_sms
                                       if self.persistent_eff is not None else None)
        if precision is not None and not precision.native:                       # the GEMMs' dtype
            self._tile_flops *= precision.gemm_speedup
            if self._persistent_tile_flops is not None:
                self._persistent_tile_flops *= precision.gemm_speedup
        self._attn_flops = hw.peak_flops * hw.attention_efficiency
        s = self.shape
        self._pair_flops = s.attn_flops_per_pair                                 # per layer
        self._kv_bytes_layer = s.kv_elems_per_token_layer * s.kv_elem_bytes
        self._qo_bytes_token = 2 * s.q_dim * s.dtype_bytes
        self._token_bytes_layer = self._qo_bytes_token + self._kv_bytes_layer     # a query token's Q, O, new K and V

    def gemm_time(self, n: int, k: int, m: int) -> float:
        tm = min(self.tile_m, max(MIN_TILE_M, 1 << (int(n) - 1).bit_length()))
        compute = min(self._tile_compute(n, k, m, tm, tn, rate, splits)
                      for tn, rate in ((self.tile_n, 1.0), (self.tile_n // 2, HALF_TILE_RATE))
                      for splits in range(1, 1 + max(1, min(MAX_SPLITS, k // SPLIT_K_MIN))))
        memory = self.shape.gemm_bytes(n, k, m) / self.bw
        return smooth_max(compute, memory)

    def _tile_compute(self, n, k, m, tm, tn, rate, splits) -> float:
        """Whole waves of (tm x tn x k/splits) work items at `rate` of a full tile's speed; from one
        full wave up on a GPU with persistent GEMMs, the items spread over every SM at its rate."""
        items = -(-n // tm) * -(-m // tn) * splits
        if self._persistent_tile_flops is not None and items >= self.sms:
            return items / self.sms * 2 * tm * tn * (k / splits) / (self._persistent_tile_flops * rate)
        waves = -(-items // self.sms)
        return waves * 2 * tm * tn * (k / splits) / (self._tile_flops * rate)

    def expert_time(self, flops: float, traffic: float) -> float:
        return max(flops / (self._tile_flops * self.sms), traffic / self.expert_bw)

    def attention_time(self, q, ctx, tokens: int, leading: int = 0, context: int | None = None) -> float:
        s, layers = self.shape, self.shape.layers
        requests = len(q)
        if context is None:
            context = sum(ctx)
        if tokens == requests:
            return layers * self._decode(requests, context + tokens)
        chunks = list(compress(range(requests), map((1).__lt__, q)))      # prefill chunks (n > 1), C-level
        decodes = requests - len(chunks)
        pairs = items = prefill_tokens = prefill_ctx = 0
        for i in chunks:
            n, c = q[i], ctx[i]
            q_tiles = -(-n // ATTN_TILE)
            # causal tiles: each query tile reads the cached keys and the chunk's keys up to its end
            pairs += q_tiles * ATTN_TILE * (c + (q_tiles + 1) * ATTN_TILE // 2)
            items += q_tiles
            prefill_tokens, prefill_ctx = prefill_tokens + n, prefill_ctx + c + n
        t = 0.0
        if decodes:
            t += self._decode(decodes, context + tokens - prefill_ctx)
        fill = min(1.0, items * s.heads / self.sms)
        compute = pairs * self._pair_flops / (self._attn_flops * fill)
        memory = (prefill_tokens * self._token_bytes_layer
                  + prefill_ctx * self._kv_bytes_layer) / self.bw
        t += self.floor + max(compute, memory) + self.latency       # + the cache write's launch
        return layers * t

    def _decode(self, requests: int, context: int) -> float:
        """One paged-decode kernel over `requests` single-token queries reading `context` KV tokens."""
        memory = (context * self._kv_bytes_layer + requests * self._token_bytes_layer) / self.bw
        compute = context * self._pair_flops / self._attn_flops
        return self.floor + max(memory, compute) + self.latency

    def describe(self) -> dict:
        out = {"kind": "kernel", "hardware": self.hw_name, "bw_efficiency": self.bw_eff,
               "kernel_latency": self.latency, "step_overhead": self.overhead, "gemm_efficiency": self.gemm_eff,
               "gemm_tile": [self.tile_m, self.tile_n], "num_sms": self.sms,
               **({"persistent_gemm_efficiency": self.persistent_eff} if self.persistent_eff is not None else {}),
               "attention_efficiency": self.attn_eff, "attention_floor": self.floor,
               "flops_efficiency": self.flops_eff}
        return {**out, **self.parallel_description(), "host_time": self.host.describe(), **self.precision_description()}
