"""`dataplane.cost_model=shaped`, the default: the roofline with GEMM efficiency by shape,
elementwise kernels priced apart and attention priced per kernel, each term fitted to public
kernel timings.

Everything else is the roofline's (embedding, LM head, tensor-parallel collectives, pipeline
stages, host time, MoE routing).

GEMMs. A library GEMM of n tokens x N columns runs ceil(n / tm) x ceil(N / tn) output tiles of
tm x tn (`gemm_wave_tile_m` x `gemm_wave_tile_n`; rows below tm take the smallest power-of-two row
tile that holds them, at least 16) in waves of `num_sms` tiles at a time. A token count that fills
whole tiles and waves runs at `curve_efficiency`; one token past a wave boundary starts a new,
nearly empty wave (wave quantisation: Vidur's H100 Qwen-72B QKV GEMM reaches 0.53 of peak at 256
tokens and 0.33 at 264). A last wave that fills a share f of the SMs costs sqrt(f) of a full one:
its few tiles share the memory system with fewer neighbours and the library splits the remainder
(split-K, stream-K), so it costs less than a full wave but more than its share. With w such waves

    t_compute = 2 x K x (w x tm x tn x num_sms + gemm_half_m x N x min(1, num_sms x 128 / N))
                / (peak x curve_efficiency)

(`gemm_half_m`: each GEMM's fixed pipeline fill in tokens of work: A100 24, H100 0, A40 48).

Persistent GEMMs. Where the GPU's preset sets `persistent_gemm_efficiency` (H100, H200), current
GEMM libraries (cuBLAS, CUTLASS) run warp-specialised persistent kernels with a tile scheduler: from
one full wave of tiles up a GEMM runs at that share of peak, its last partial wave costing only its
share (w = tiles / num_sms, no step at a wave boundary), and below one wave at the same rate. Which
library runs the kernels is the serving engine's (`serving_engine.persistent_gemms`: on in `none`,
kernel time on a current stack, and in the vLLM presets; off in `vidur`, kernel time on the library
Vidur's H100 profiles were taken with, and in `eager_nccl`): an older library's H100 GEMMs step at
wave boundaries and top out lower (Vidur's: 0.64-0.73 of peak at >= 2,049 tokens, median per
GEMM), which the curve above prices. Split-K of sub-wave GEMMs (`serving_engine.gemm_split_k`) is the engine's choice too.
Memory time (weights, activations in and out at `bw_efficiency`) joins it by a p-norm with p = 4. The tile sizes, the
curve and the fill are Vidur's (experiments/check_cost_terms.py,
experiments/check_roofline_profiles.py): on each GPU's profiles the tile that fits its steps best
(128 x 128 on the H100, 64 x 64 on the A100 and A40), `curve_efficiency` what its FLOP-bound
GEMMs reach in whole waves (0.73 H100 and A100, 0.78 A40). The time is a function of the token
count alone for a given GEMM, so the dense part of a step stays cached per token count.

Elementwise kernels (the norms, RoPE, the activation, the residual adds) do not stream like a
GEMM's weights: on Vidur's profiles they reach 0.51 (A100), 0.56 (H100) and 0.75 (A40) of peak
bandwidth at >= 1,024 tokens (`elementwise_bw_efficiency`; the roofline charges the GEMVs'
0.79-0.90, 30-33 % short on a prefill's elementwise time on the A100 and H100). The norms, RoPE
and the activation launch one thread block per token, so below about one token per SM their time
does not shrink (flat up to 64-128 tokens on the A40 and A100, ~256 on the H100): they cost at
least `num_sms` tokens' traffic, plus `elementwise_latency` each; the adds stream flat.

Attention: one kernel per layer per phase (vLLM launches a varlen FlashAttention kernel for the
prefill chunks and a paged kernel for the decodes) plus the KV-cache write's launch.

- Decode, split (`serving_engine.decode_split_kv`): `decode_attention_floor` + the larger of bytes
  (each request's KV read once, its Q read, O written, new K/V written) at `bw_efficiency` and
  FLOPs at `attention_efficiency`. Split-KV kernels stream at full bandwidth even for one request;
  what a tiny decode costs is the floor (scheduling the splits and merging them).
- Decode, unsplit: one work item per (request, KV head), each streaming its request's KV at one
  SM's share of the bandwidth, so the kernel ends one item after the bytes are through: the bytes
  at `bw_efficiency` + one item's KV at bandwidth / num_sms + its launch (`kernel_latency`), with no
  floor (no splits to merge).
  FlashInfer's planner (`planned`) splits only where the items leave part of its grid
  (`decode_attention_blocks_per_sm` x num_sms) idle and the requests' KV spans more than its
  least chunk of 128 tokens (the mean request's, as the step keeps sums). On Vidur's A100
  FlashInfer decodes (experiments/check_cost_terms.py) this takes the split floor's +234 % at 32
  cached tokens to +1 %, and a TP-4 batch's jump from 139 to 177 us between 160 and 168
  requests (320 and 336 items about a grid of 324) is the switch from split to unsplit.
- Prefill: `attention_floor` + the larger of bytes and FLOPs, the FLOPs of each chunk (its
  causal query-key pairs) at `attention_efficiency` x r(n) for a chunk of n query tokens:

      r(n) = 1 - attention_length_slope x log2(16384 / n)     (n < 16384; at least 0.1)

  short chunks fill few query tiles per head and pay the tile's pipeline fill on every key
  block, so FLOP efficiency falls by a constant share per halving of the chunk (Vidur's A100
  Llama-3-8B attention.csv: 0.23 of peak at 64 tokens, 0.36 at 1,024, 0.48 at 14,336, a
  straight line in log2 n; independent of the cached context).

MoE experts under vLLM's fused-MoE Triton kernel (`serving_engine.fused_moe_tiles`): the padded
row tiles' FLOPs (policylab.dataplane.moe) at the GEMMs' rate, each output tile of the gate-up GEMM
(K = hidden) and of the down GEMM (K = the expert's width) paying `fused_moe_tile_overhead` (null: 800)
more of K than it reduces (it loads its rows by sorted token index and scales them by the routing
weights), joined with the weights' traffic at p = 2, not a dense GEMM's 4. Fitted on vLLM's own
kernel timings on Hopper (PR #24700: Mixtral-8x7B at TP 2 on an H100, tuned tiles, 16-1,536 tokens;
PR #44818: Gemma-4's 128 experts of width 704 on an H200, tuned and default tiles, 16-4,096 tokens):
4.6 % MAPE over 39 points, worst −12.9 %, against 16.4 % and −43 % with a dense GEMM's rate and knee
(experiments/check_moe_kernels.py).
A fine-grained expert (width 704-768) reaches ~0.4 of peak at 4k tokens, a wide one (7,168) ~0.57.

The per-step cost stays O(prefill chunks): decodes are priced from sums the roofline takes.
"""
from __future__ import annotations

from math import log2

from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.kernel_model import KernelCostModel

COLUMN_TILE = 128           # output columns per SM in one wave of the fill term (a 128-wide tile)
MIN_ROW_TILE = 16           # the smallest row tile a GEMM of few tokens runs
PARTIAL_WAVE_EXPONENT = 0.5 # a last wave filling a share f of the SMs costs f ** this of a full wave
GEMM_P_NORM = 4.0           # the GEMM knee: 2^(1/4) = 1.19x the larger bound at balance
FUSED_MOE_P_NORM = 2.0      # vLLM's fused-MoE kernel's knee: 2^(1/2) = 1.41x at balance (module doc)
FUSED_MOE_TILE_OVERHEAD = 800.0   # K's worth of fixed work per output tile of that kernel (module doc)

SPLIT_K_MIN = 1024          # the least K each part of a split-K GEMM keeps
FLASH_TILE = 128            # FlashAttention's query and key tile (head_dim 128)
PLANNER_MIN_CHUNK = 128     # the least KV tokens FlashInfer's decode planner puts in one split chunk
FULL_RATE_CHUNK = 16384     # the chunk length at which prefill attention runs at attention_efficiency
MIN_LENGTH_SHARE = 0.1      # r(n) never below this (a guard for tiny chunks; not reached above 2 tokens)


class ShapedCostModel(KernelCostModel):
    """The roofline with the GEMM curve, the elementwise kernels and the attention kernels above (module doc)."""

    def __init__(self, model: ModelConfig, hw: HardwareConfig, tp: int = 1, pp: int = 1, engine=None,
                 precision=None):
        super().__init__(model, hw, tp, pp, engine, precision)
        e = self.engine.cfg
        self.half_m, self.slope = hw.gemm_half_m, hw.attention_length_slope
        self.decode_floor = hw.decode_attention_floor if e.decode_attention_floor is None else e.decode_attention_floor
        self.curve_eff = hw.curve_efficiency
        s = self.shape
        self.elementwise_eff, self.elementwise_latency = hw.elementwise_bw_efficiency, hw.elementwise_latency
        self._elementwise_bw = hw.mem_bandwidth * hw.elementwise_bw_efficiency
        gemm_launches = (s.kernels_per_layer - s.elementwise_kernels) * self.latency
        self._layer_launches = gemm_launches + self.elementwise_kernels * hw.elementwise_latency
        self._moe_layer_launches = ((s.moe_kernels_per_layer - s.elementwise_kernels) * self.latency
                                    + self.elementwise_kernels * hw.elementwise_latency)
        # the decode kernel, chosen once: split the KV always, never, or as FlashInfer's planner would
        self._decode = {"always": self._split_decode, "never": self._unsplit_decode,
                        "planned": self._planned_decode}[e.decode_split_kv]
        self._planner_requests = hw.decode_attention_blocks_per_sm * hw.num_sms / s.kv_heads
        self._item_seconds_per_token = self._kv_bytes_layer / s.kv_heads * hw.num_sms / self.bw
        self._split_k, self._flash = e.gemm_split_k, e.flash_prefill
        self._flash_flops = hw.peak_flops * e.prefill_attention_efficiency
        self._tile_overhead, self._heads_per_sm = e.prefill_attention_tile_overhead, s.heads / hw.num_sms
        self._cols_per_wave = hw.num_sms * COLUMN_TILE
        # persistent (stream-K) GEMMs from one full wave up: decided once, by KernelCostModel (persistent_eff)
        self._persistent = self.persistent_eff is not None
        self._gemm_flops = hw.peak_flops * hw.curve_efficiency
        self._wave_flops = hw.peak_flops * (self.persistent_eff if self._persistent else hw.curve_efficiency)
        if precision is not None and not precision.native:                # the GEMMs' dtype
            self._gemm_flops *= precision.gemm_speedup
            self._wave_flops *= precision.gemm_speedup
        self.tile_m, self.tile_n = int(hw.gemm_wave_tile_m), int(hw.gemm_wave_tile_n)
        # vLLM's fused-MoE kernel: each output tile of the gate-up GEMM (K = hidden, 2/3 of the FLOPs) and of the
        # down GEMM (K = the expert's width) pays fused_moe_tile_overhead more of K, and its terms join at p = 2
        self._expert_stretch, self._expert_p = 1.0, GEMM_P_NORM
        if e.fused_moe_tiles and s.moe_layers:
            k0 = FUSED_MOE_TILE_OVERHEAD if e.fused_moe_tile_overhead is None else e.fused_moe_tile_overhead
            self._expert_stretch = (2 * (s.hidden + k0) / s.hidden + (s.expert_f + k0) / s.expert_f) / 3
            self._expert_p = FUSED_MOE_P_NORM

    def gemm_time(self, n: int, k: int, m: int) -> float:
        tm = min(self.tile_m, max(MIN_ROW_TILE, 1 << (int(n) - 1).bit_length()))
        tiles = -(-n // tm) * -(-m // self.tile_n)
        full, rest = divmod(tiles, self.sms)
        splits = min(self.sms // tiles, k // SPLIT_K_MIN) if self._split_k and not full else 1
        # less than one wave: split K over the idle SMs (each of the tiles x splits items does K / splits);
        # a persistent kernel spreads a last partial wave over every SM; else it runs at sqrt of its share
        if full and self._persistent:
            waves, flops = tiles / self.sms, self._wave_flops
        else:
            waves = 1 / splits if splits > 1 else full + (rest / self.sms) ** PARTIAL_WAVE_EXPONENT
            flops = self._wave_flops if self._persistent else self._gemm_flops
        work = waves * tm * self.tile_n * self.sms + self.half_m * m * min(1.0, self._cols_per_wave / m)
        compute = 2 * k * work / flops
        memory = self.shape.gemm_bytes(n, k, m) / self.bw
        return (compute ** GEMM_P_NORM + memory ** GEMM_P_NORM) ** (1 / GEMM_P_NORM)

    def elementwise_time(self, n: int, elems: int) -> float:
        """Norms, RoPE and the activation (one thread block per token) cost at least `num_sms` tokens'
        traffic, the residual adds stream flat; both at `elementwise_bw_efficiency` (module doc)."""
        adds = self.residual_add_elems
        return (max(n, self.sms) * (elems - adds) + n * adds) * self.shape.dtype_bytes / self._elementwise_bw

    def expert_time(self, flops: float, traffic: float) -> float:
        compute, memory = flops * self._expert_stretch / self._gemm_flops, traffic / self.expert_bw
        p = self._expert_p
        return (compute ** p + memory ** p) ** (1 / p)

    def length_share(self, n: int) -> float:
        """r(n): the share of attention_efficiency a prefill chunk of n query tokens reaches."""
        if n >= FULL_RATE_CHUNK:
            return 1.0
        return max(MIN_LENGTH_SHARE, 1.0 - self.slope * log2(FULL_RATE_CHUNK / n))

    def attention_time(self, q, ctx, tokens: int, leading: int = 0, context: int | None = None) -> float:
        requests = len(q)
        if context is None:
            context = sum(ctx)
        if tokens == requests:
            return self.shape.layers * self._decode(requests, context + tokens)
        if not leading:                       # the first entries that are one-token queries (mostly all of them)
            ones = q.count(1)
            leading = ones if q[:ones].count(1) == ones else 0
        flop_time = prefill_tokens = prefill_ctx = query_tiles = chunks = 0
        flash, tile_overhead = self._flash, self._tile_overhead
        i = leading - 1
        while (i := i + 1) < requests:          # (by index: no slices of the batch's lists, no range object)
            n = q[i]
            if n < 2:
                continue
            c = ctx[i]            # a prefill chunk (n > 1): every query sees the cached keys and its own up to itself
            if flash:             # FlashAttention tiles: K keys a query tile on average, + fixed work a tile
                keys = c + (n + FLASH_TILE) / 2
                flop_time += n * (c + (n + 1) / 2) * (keys + tile_overhead) / keys
                query_tiles += -(-n // FLASH_TILE)
            else:
                flop_time += n * (c + (n + 1) / 2) / self.length_share(n)
            prefill_tokens, prefill_ctx, chunks = prefill_tokens + n, prefill_ctx + c + n, chunks + 1
        t = 0.0
        decodes = requests - chunks
        if decodes:
            t += self._decode(decodes, context + tokens - prefill_ctx)
        if self._flash:       # (query tile x head) work items that fill fewer SMs than the GPU has
            compute = flop_time * self._pair_flops / (self._flash_flops * min(1.0, query_tiles * self._heads_per_sm))
        else:
            compute = flop_time * self._pair_flops / self._attn_flops
        memory = (prefill_tokens * self._token_bytes_layer
                  + prefill_ctx * self._kv_bytes_layer) / self.bw
        t += self.floor + (memory if memory > compute else compute) + self.latency   # + the cache write's launch
        return self.shape.layers * t

    def _split_decode(self, requests: int, context: int) -> float:
        """A split-KV decode kernel over `requests` single-token queries reading `context` KV tokens: the
        floor, the larger of its bytes and FLOPs, the cache write's launch (module doc). The default
        engine's kernel, priced every step: its work is inline here and in `_unsplit_decode`."""
        memory = (context * self._kv_bytes_layer + requests * self._token_bytes_layer) / self.bw
        compute = context * self._pair_flops / self._attn_flops
        return self.decode_floor + (compute if compute > memory else memory) + self.latency

    def _unsplit_decode(self, requests: int, context: int) -> float:
        """An unsplit decode kernel: its launch, the same work, one work item more, the cache write's launch."""
        memory = (context * self._kv_bytes_layer + requests * self._token_bytes_layer) / self.bw
        compute = context * self._pair_flops / self._attn_flops
        last_item = context / requests * self._item_seconds_per_token
        return self.latency + (compute if compute > memory else memory) + last_item + self.latency

    def _planned_decode(self, requests: int, context: int) -> float:
        """FlashInfer's planner: split while the items leave part of its grid idle and the KV spans more
        than one chunk."""
        if requests < self._planner_requests and context > PLANNER_MIN_CHUNK * requests:
            return self._split_decode(requests, context)
        return self._unsplit_decode(requests, context)

    def describe(self) -> dict:
        out = {"kind": "shaped", "hardware": self.hw_name, "bw_efficiency": self.bw_eff,
               "kernel_latency": self.latency, "step_overhead": self.overhead,
               "curve_efficiency": self.curve_eff, "gemm_half_m": self.half_m, "p_norm": GEMM_P_NORM,
               **({"persistent_gemm_efficiency": self.persistent_eff} if self._persistent else {}),
               "gemm_wave_tile": [self.tile_m, self.tile_n], "partial_wave_exponent": PARTIAL_WAVE_EXPONENT,
               "elementwise_bw_efficiency": self.elementwise_eff, "elementwise_latency": self.elementwise_latency,
               "attention_efficiency": self.attn_eff, "attention_length_slope": self.slope,
               "attention_floor": self.floor, "decode_attention_floor": self.decode_floor}
        return {**out, **self.parallel_description(), "host_time": self.host.describe(), **self.precision_description()}
