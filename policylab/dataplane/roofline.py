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

Shared with the kernel cost model (`policylab.dataplane.kernel_model`, which replaces the GEMM
and attention terms): tensor and pipeline parallelism (`policylab.dataplane.parallel`: per-GPU
shards, ring all-reduces, pipeline bubble), host time per step, request and token
(`policylab.dataplane.host_time`), MoE layers (`policylab.dataplane.moe`) and MLA shapes
(`policylab.dataplane.shape`). With one GPU, no MoE and host time `step_overhead` only, every
number is the same as without them, and `step_time` is this class's own method.
"""
from __future__ import annotations

from operator import mul

from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.host_time import HostTime
from policylab.dataplane.moe import default_config_terms, expert_gemm_terms
from policylab.dataplane.parallel import Link, check_parallel, micro_batches, pipelined
from policylab.dataplane.serving_engine import ServingEngine
from policylab.dataplane.precision import Precision
from policylab.dataplane.shape import ModelShape

__all__ = ["ModelShape", "Roofline", "causal_pairs", "smooth_max"]

P_NORM = 3.0      # knee sharpness (see above): 2^(1/3) = 1.26x the larger bound at balance
FIXED_PARTS_CACHED = 1 << 16   # (requests, tokens, sampled) combinations whose fixed parts are kept


def smooth_max(a: float, b: float) -> float:
    """p-norm of two times: the roofline's max with the partial overlap of a real kernel."""
    return (a ** P_NORM + b ** P_NORM) ** (1 / P_NORM)


def causal_pairs(q, ctx, tokens: int, leading: int = 0, context: int | None = None) -> int:
    """A step's query x key pairs: n·(c + (n+1)/2) summed over its entries (n query tokens after c
    cached ones; every query sees the cache and the chunk up to itself), as integers: exactly the
    same value however summed. The first `leading` entries are one-token decodes, their terms c + 1;
    `context` is sum(ctx) (None: summed here). The roofline's attention and the energy meter's work."""
    if context is None:
        context = sum(ctx)
    if tokens == len(q):                                              # decodes only: n = 1
        return context + tokens
    if leading:           # the few entries after the leading decodes by index (no slices, no range object)
        rest = products = squares = 0
        i, requests = leading, len(q)
        while i < requests:
            n, c = q[i], ctx[i]
            rest += c
            products += n * c
            squares += n * n
            i += 1
        return context - rest + products + (leading + squares + tokens) // 2
    return sum(map(mul, q, ctx)) + (sum(map(mul, q, q)) + tokens) // 2


class Roofline:
    """Step time of a batch from the shape and the hardware (seconds); dense part cached per token count."""

    # the share of the last step the GPUs ran kernels (and collectives), the rest waiting on the host or
    # on launches (what the energy meter charges idle power for); None where step_time is kernels +
    # step_overhead only (the meter then takes the step_overhead as the wait)
    kernel_share: float | None = None

    def __init__(self, model: ModelConfig, hw: HardwareConfig, tp: int = 1, pp: int = 1,
                 engine: ServingEngine | None = None, precision: Precision | None = None):
        check_parallel(tp, pp, model.num_attention_heads, model.num_hidden_layers)
        self.shape = s = ModelShape(model, tp, precision)
        self.tp, self.pp = tp, pp
        self.engine = engine = engine or ServingEngine()
        self.flops = hw.peak_flops * hw.flops_efficiency
        self.gemm_flops = self.flops * precision.gemm_speedup if precision else self.flops   # GEMMs' dtype
        self.bw = hw.mem_bandwidth * hw.bw_efficiency
        self.latency = hw.kernel_latency
        self.overhead = hw.step_overhead
        self.host = HostTime(hw)
        self.link = Link(hw, tp, engine)
        self.hw_name, self.flops_eff, self.bw_eff = hw.name, hw.flops_efficiency, hw.bw_efficiency
        self._s_per_attn_pair = s.attn_flops_per_pair * s.layers / self.flops
        self._s_per_kv_token = s.kv_bytes_per_token / self.bw
        # the engine's fused residual-add + RMSNorm and SiLU-and-mul kernels: the adds' traffic folds into
        # the norms (read and write the residual too) and two kernels a layer go (serving_engine.py)
        fused = engine.cfg.fused_elementwise and s.norms == 2     # (phi's one LayerNorm: no fused add)
        self.elementwise_kernels = s.elementwise_kernels - (2 if fused else 0)
        self.residual_add_elems = 0 if fused else s.residual_add_elems
        self._fold = (s.norms * 2 * s.hidden - s.residual_add_elems) if fused else 0
        self._elementwise_elems = s.elementwise_elems + self._fold
        self._moe_elementwise_elems = s.moe_elementwise_elems + self._fold
        # the routed experts' bandwidth and fixed cost: vLLM's tuned fused-MoE tiles stream at the weights'
        # bandwidth; its default ones, where it ships no tuned ones, as measured (policylab.dataplane.moe)
        untuned = default_config_terms(hw, engine.cfg.fused_moe_config) if s.moe_layers else None
        self._default_moe_tiles = untuned is not None
        self.expert_bw, self._moe_floor = (hw.mem_bandwidth * untuned[0], untuned[1]) if untuned else (self.bw, 0.0)
        # every layer's kernel launches (GEMMs and elementwise ops; the shaped model prices them apart)
        self._layer_launches = (len(s.gemms) + self.elementwise_kernels) * self.latency
        self._moe_layer_launches = (s.moe_kernels_per_layer - s.elementwise_kernels + self.elementwise_kernels) \
            * self.latency
        # kernels a step launches (the layers' GEMMs, elementwise ops, attention and cache write, all-reduces;
        # embedding, final norm, LM head, sampler): what an engine without CUDA graphs pays the host for
        per_layer = max(len(s.gemms), len(s.moe_gemms) + 4) + self.elementwise_kernels + 2 + (2 if tp > 1 else 0)
        self._step_kernels, self._attention_kernels = s.layers * per_layer + 4, 2 * s.layers
        self._dense: dict = {}
        self._lm_head: dict = {}
        self._stages: dict = {}          # pipeline: (tokens, micro-batches) -> one micro-batch's layers, hand-off, embedding
        self._fixed: dict = {}           # one stage: (requests, tokens, sampled) -> _fixed_parts
        if (tp > 1 or pp > 1 or self.host.per_request or self.host.per_token or engine.has_host_time
                or engine.async_scheduling):
            self.step_time = self._parallel_step_time

    def gemm_time(self, n: int, k: int, m: int) -> float:
        """One n x k by k x m GEMM without its launch (counted per layer): the p-norm roofline."""
        return smooth_max(2 * n * k * m / self.gemm_flops, self.shape.gemm_bytes(n, k, m) / self.bw)

    def layers_time(self, n: int) -> float:
        """All transformer layers' GEMMs and elementwise ops for n tokens (no attention)."""
        s, b, gemm_time = self.shape, self.shape.dtype_bytes, self.gemm_time
        gemm = sum(gemm_time(n, k, m) for k, m in s.gemms)
        t = s.dense_layers * (gemm + self.elementwise_time(n, self._elementwise_elems) + self._layer_launches)
        if s.moe_layers:
            t += s.moe_layers * self.moe_layer_time(n)
        if self.tp > 1:          # two all-reduces per layer (attention output, MLP down)
            t += 2 * s.layers * self.link.all_reduce(n * s.hidden * b)
        return t

    def moe_layer_time(self, n: int) -> float:
        """One MoE layer: attention GEMMs, router, shared experts, the routed experts touched."""
        s, b = self.shape, self.shape.dtype_bytes
        gemm = sum(self.gemm_time(n, k, m) for k, m in s.moe_gemms)
        flops, traffic = expert_gemm_terms(n, s.hidden, s.expert_f, s.experts, s.top_k, b, s.weight_elem_bytes,
                                           self.engine.cfg.fused_moe_tiles, self._default_moe_tiles)
        experts = self.expert_time(flops, traffic) + self._moe_floor
        return gemm + experts + self.elementwise_time(n, self._moe_elementwise_elems) + self._moe_layer_launches

    def elementwise_time(self, n: int, elems: int) -> float:
        """One layer's norms, RoPE, activation and residual adds (`elems` read and written per token):
        traffic at the weights' streaming bandwidth; their launches are counted per layer."""
        return n * elems * self.shape.dtype_bytes / self.bw

    def expert_time(self, flops: float, traffic: float) -> float:
        """The two grouped expert GEMMs, joined as a dense GEMM's terms are."""
        return smooth_max(flops / self.gemm_flops, traffic / self.expert_bw)

    def embedding_time(self, n: int) -> float:
        """A gather: n rows read and written (vocabulary-parallel under TP: one all-reduce more)."""
        t = self.latency + 2 * n * self.shape.hidden * self.shape.dtype_bytes / self.bw
        if self.tp > 1:
            t += self.link.all_reduce(n * self.shape.hidden * self.shape.dtype_bytes)
        return t

    def lm_head_time(self, sampled: int) -> float:
        t = self._lm_head.get(sampled)
        if t is None:
            s, b = self.shape, self.shape.dtype_bytes
            vocab = s.vocab // self.tp                      # vocabulary-parallel, then the logits gathered
            compute = 2 * sampled * s.hidden * vocab / self.flops
            memory = (s.hidden * vocab + sampled * (s.hidden + vocab)) * b / self.bw
            t = self.latency + smooth_max(compute, memory) if sampled else 0.0
            if sampled and self.tp > 1:
                t += self.link.all_gather(sampled * s.vocab * b)
            self._lm_head[sampled] = t
        return t

    def dense_time(self, tokens: int) -> float:
        """Kernel time of everything but attention and the LM head (what a Vidur mlp.csv measures)."""
        t = self._dense.get(tokens)
        if t is None:
            t = self._dense[tokens] = self.layers_time(tokens) + self.embedding_time(tokens)
        return t

    def attention_time(self, q, ctx, tokens: int, leading: int = 0, context: int | None = None) -> float:
        """All layers' attention: one kernel per layer over the batch's query-key pairs and KV reads.
        The first `leading` entries are one-token decodes; `context` is sum(ctx) (None: summed here)."""
        if context is None:
            context = sum(ctx)
        pairs = causal_pairs(q, ctx, tokens, leading, context)
        return (self.shape.layers * self.latency
                + smooth_max(self._s_per_attn_pair * pairs, self._s_per_kv_token * (context + 2 * tokens)))

    def step_time(self, q, ctx, tokens: int, sampled: int, leading: int = 0, context: int | None = None) -> float:
        """Seconds of a step; `leading` and `context` as attention_time takes them (sums the plane has)."""
        dense, head = self._dense.get(tokens), self._lm_head.get(sampled)     # (every step: the cached
        if dense is None:                                                     # parts without a call)
            dense = self.dense_time(tokens)
        if head is None:
            head = self.lm_head_time(sampled)
        return dense + head + self.attention_time(q, ctx, tokens, leading, context) + self.overhead

    def _parallel_step_time(self, q, ctx, tokens: int, sampled: int, leading: int = 0,
                            context: int | None = None) -> float:
        """step_time with tensor or pipeline parallelism, per-request / per-token host time or a
        serving engine's host work: kernel time, then the engine's launches and host work
        (serial, or hidden behind the GPU under async scheduling: serving_engine.py)."""
        requests = len(q)
        if self.pp == 1:          # (every step: the parts that do not depend on the contexts, cached)
            fixed = self._fixed.get((requests, tokens, sampled))
            if fixed is None:
                fixed = self._fixed_parts(requests, tokens, sampled)
            gpu_fixed, launches, host = fixed
            gpu = gpu_fixed + self.attention_time(q, ctx, tokens, leading, context)
        else:
            m = micro_batches(self.pp, requests)
            stage = self._stages.get((tokens, m))
            if stage is None:
                per_mb = -(-tokens // m)
                stage = self._stages[tokens, m] = (
                    self.layers_time(per_mb), self.link.send(per_mb * self.shape.hidden * self.shape.dtype_bytes),
                    self.embedding_time(tokens))
            dense, handoff, embedding = stage
            layers = dense + self.attention_time(q, ctx, tokens, leading, context) / m
            gpu = embedding + pipelined(layers / self.pp, handoff, self.pp, m) + self.lm_head_time(sampled)
            launches, host = self._launch_time(requests, tokens), self.host_time(requests, tokens)
        step = self.engine.step(gpu, launches, host)
        self.kernel_share = gpu / step if step > 0 else 1.0
        return step

    def _fixed_parts(self, requests: int, tokens: int, sampled: int) -> tuple:
        """A one-stage step's (dense + LM head kernel time, launch time, host time): functions of its
        request, token and sampled counts only, cached (and the cache dropped when it grows large)."""
        if len(self._fixed) >= FIXED_PARTS_CACHED:
            self._fixed.clear()
        parts = self._fixed[requests, tokens, sampled] = (
            self.dense_time(tokens) + self.lm_head_time(sampled), self._launch_time(requests, tokens),
            self.host_time(requests, tokens))
        return parts

    def host_time(self, requests: int, tokens: int) -> float:
        """Host seconds of a step: the hardware's (policylab.dataplane.host_time), then the engine's."""
        host = self.host(requests, tokens)
        e = self.engine
        if e.has_host_time:
            host += e.host_per_step + e.host_per_request * requests + e.host_per_token * tokens
        return host

    def _launch_time(self, requests: int, tokens: int) -> float:
        """Host seconds launching a step's kernels (none without per-kernel launch cost)."""
        e = self.engine
        return e.launches(self._step_kernels, tokens, tokens == requests, self._attention_kernels) \
            if e.launch else 0.0

    def describe(self) -> dict:
        out = {"kind": "roofline", "hardware": self.hw_name, "flops_efficiency": self.flops_eff,
               "bw_efficiency": self.bw_eff, "kernel_latency": self.latency, "step_overhead": self.overhead,
               "p_norm": P_NORM}
        return {**out, **self.parallel_description(), **self.precision_description()}

    def precision_description(self) -> dict:
        """The dtypes, where they are not the model's own (summary.json's `cost_model`)."""
        p = self.shape.precision
        return {} if p is None or p.native else {"precision": p.describe()}

    def parallel_description(self) -> dict:
        """The parallel layout and host model, where they are not the single-GPU, fixed-host default
        (which the keys above already state: one GPU, host time = step_overhead per step)."""
        out = {}
        if self.tp > 1 or self.pp > 1:
            out.update(tensor_parallel=self.tp, pipeline_parallel=self.pp, link=self.link.describe())
        if self.host.named or self.host.per_request or self.host.per_token:
            out["host_time"] = self.host.describe()
        if not self.engine.is_none:        # (its every constant is in the run's config echo)
            out["serving_engine"] = self.engine.describe()
        return out
