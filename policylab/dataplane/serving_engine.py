"""The serving engine's own costs: what the same kernels cost inside one engine or another.

The same model on the same GPU decodes at different speeds under different engines: how the
tensor-parallel all-reduces are implemented, whether the step's kernels replay a CUDA graph or
are launched one by one from Python, how much host work the step has and whether it overlaps
the GPU's, and which attention kernels run. `serving_engine=NAME` (configs/serving_engine/) picks
a preset; every constant is a key of `ServingEngineConfig` with its source in the preset's file.

Terms (`ServingEngine`):

- **All-reduce**: `nccl` is NCCL's ring through torch.distributed, as the link model fits it
  (Vidur's all_reduce.csv). `custom` is vLLM's own kernels for a TP group on NVLink (2, 4, 6 or 8
  GPUs, messages below `custom_all_reduce_max_bytes`): one-shot (every GPU reads the p - 1
  others' S bytes) for 2 GPUs and below `one_shot_max_bytes` (4 GPUs: 512 KiB, 8: 256 KiB;
  vLLM's csrc/custom_all_reduce.cuh), else two-shot (reduce-scatter then all-gather: 2(p-1)/p x S
  read); each `latency + bytes read / bandwidth`, the bandwidth the link's (what NCCL's ring
  reaches on it) unless `custom_all_reduce_bandwidth` sets one. Larger messages go to NCCL.
  `collective_overhead` adds what an eager engine pays per collective on top of the kernel
  (launch from Python, waiting for the slowest rank).
- **Kernel launches**: with `cuda_graphs`, a step of at most `cuda_graph_max_tokens` tokens
  replays a captured graph (decode-only steps whole; steps with prefill chunks piecewise, the
  attention kernels launched apart, as vLLM's FULL_AND_PIECEWISE mode); every other kernel costs
  the host `kernel_launch` seconds. The launches overlap the GPU's work.
- **Host work**: `host_per_step + host_per_request x requests + host_per_token x tokens`
  (scheduling, input preparation, output processing). Without `async_scheduling` it is serial:
  step = host + max(kernels, launches). With it (vLLM's default since late 2025) the scheduler
  works one step ahead, so host work hides behind the GPU: step = max(kernels, launches + host),
  and an arriving request joins one step later (the data plane's `schedules_ahead`, which the
  engine reads). `async_overlap_norm` p makes that overlap partial: step = (kernels^p + (launches
  + host)^p)^(1/p), the sum at p = 1 and the max as p grows. Two stages that hand each other one
  step at a time lose time where they take about as long, as each waits on the other's slower
  steps (prefill chunks, arrivals, the host's own jitter); the default (null) is the max, and
  without async scheduling the key is refused (there is no overlap to make partial).
- **Kernels the engine chooses**: `gemm_split_k` (a GEMM whose output tiles fill less than one wave
  of SMs splits K over the idle SMs, as cuBLAS's split-K and stream-K kernels do, instead of
  running a partly empty wave); `persistent_gemms` (the engine's GEMM library runs persistent,
  tile-scheduled kernels where the GPU has them: from one full wave of tiles up a GEMM runs at the
  hardware preset's `persistent_gemm_efficiency`, with no step at a wave boundary; off, the GPU's
  wave model, as the older library of Vidur's H100 profiles ran them); `fused_moe_tiles` (MoE experts priced on
  vLLM's fused-MoE kernel's row tiles, each expert's tokens padded up to BLOCK_SIZE_M, each output tile of its
  two GEMMs paying `fused_moe_tile_overhead` more of K than it reduces: policylab.dataplane.moe); `fused_moe_config` (`tuned`, or `default` where vLLM ships no tuned tiles for
  the model's experts on the GPU and logs "Using default MoE config": slower, per the GPU's
  `hardware.fused_moe_default_*`); `flash_prefill` (prefill attention priced as FlashAttention's
  tiles: a query tile of 128 tokens costs its keys' work plus `prefill_attention_tile_overhead`
  keys' worth of fixed work (loading Q, the softmax epilogue, writing O), so efficiency is
  `prefill_attention_efficiency` x K / (K + overhead) for K keys per query tile, and the kernel's
  (query tile x head) work items fill the SMs or not); `fused_elementwise` (vLLM's fused residual-add + RMSNorm and
  SiLU-and-mul kernels: 4 elementwise kernels a layer instead of 6, the adds' traffic folded into
  the norms); `decode_attention_floor` (its decode kernel's fixed cost; None: the hardware's,
  fitted on FlashInfer); `decode_split_kv`: `always` (flash-decoding: the KV sequence split over
  the SMs, so a few long requests still stream at full bandwidth, for the floor's fixed cost of
  scheduling the splits and merging them), `never` (one work item per (request, KV head), each
  streaming its KV at one SM's share of the bandwidth: a few long requests leave most SMs idle),
  or `planned` (FlashInfer's decode planner: split only where the work items leave part of its
  grid of `hardware.decode_attention_blocks_per_sm` x num_sms thread blocks idle and a request's
  KV spans more than 128 tokens, its least chunk; otherwise the unsplit kernel, with no floor).
  `true` and `false`, the key's former values, mean `always` and `never`.
- **Memory**: the KV cache gets what `gpu_memory_utilization` leaves after the weights and
  `non_kv_memory` (+ `non_kv_memory_parallel` in a parallel group) on every GPU, as vLLM's memory
  profile computes it.
- **Client latency**: `client_latency` seconds from a client's send to the engine plus from a
  step's end to the client (tokenizing, IPC between the API server and the engine, detokenizing,
  streaming). A load generator's TTFT and E2E include it; the engine's own latencies (the run's
  summary) do not. `fidelity-e2e` adds it when it compares with a benchmark's measurements.

`serving_engine=none` prices kernel time only, with NCCL's ring: exactly the cost model without
an engine (what a profiler of single kernels measures on a current library stack, and what
`cost_model=roofline` results were recorded with). `serving_engine=vidur` is kernel time only on
the library Vidur's profiles were taken with (no persistent GEMMs): what its profiles measure.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Optional

ALL_REDUCES = ("nccl", "custom")
FUSED_MOE_CONFIGS = ("tuned", "default")   # vLLM's tuned fused-MoE tiles for the GPU and shape, or its defaults
CUSTOM_WORLD_SIZES = (2, 4, 6, 8)          # vLLM's CustomAllreduce._SUPPORTED_WORLD_SIZES
DECODE_SPLITS = ("always", "never", "planned")   # decode_split_kv: flash-decoding, one item per KV head, FlashInfer's plan
SPLIT_SPELLINGS = {"true": "always", "false": "never"}   # the key's former booleans (OmegaConf hands "True")


@dataclass
class ServingEngineConfig:
    """`serving_engine=NAME`: the engine the simulated steps run in (configs/serving_engine/)."""
    name: str = "none"
    async_scheduling: bool = False          # the scheduler works one step ahead of the GPU
    async_overlap_norm: Optional[float] = None   # p of a partial overlap of host and GPU (None: the max)
    host_per_step: float = 0.0              # host seconds per step (scheduling, inputs, outputs)
    host_per_request: float = 0.0           # host seconds per scheduled request
    host_per_token: float = 0.0             # host seconds per scheduled token
    cuda_graphs: bool = False               # steps up to cuda_graph_max_tokens replay a captured graph
    cuda_graph_max_tokens: int = 512        # vLLM's largest captured batch (max_cudagraph_capture_size)
    kernel_launch: float = 0.0              # host seconds per kernel launched outside a graph
    fused_elementwise: bool = False         # fused residual-add + RMSNorm and SiLU-and-mul kernels
    decode_attention_floor: Optional[float] = None   # the decode kernel's fixed seconds (None: the hardware's)
    decode_split_kv: str = "always"         # always | never | planned: decode kernels split the KV over the SMs
    flash_prefill: bool = False             # prefill attention as FlashAttention's tiles (else the hardware's curve)
    prefill_attention_efficiency: float = 0.68     # flash_prefill: share of peak FLOP/s with long key spans
    prefill_attention_tile_overhead: float = 385.0  # flash_prefill: keys' worth of fixed work per query tile
    gemm_split_k: bool = False              # GEMMs of less than one wave of tiles split K to fill the SMs
    persistent_gemms: bool = True           # persistent GEMMs from one full wave up, where the GPU has a level
    fused_moe_tiles: bool = False           # MoE expert FLOPs on vLLM's fused-MoE row tiles (padded per expert)
    fused_moe_tile_overhead: Optional[float] = None   # fused_moe_tiles: K's worth of fixed work per output tile
                                            # of its GEMMs (None: the kernel's measured 800)
    fused_moe_config: str = "tuned"         # tuned | default: vLLM's default tiles where it ships no tuned ones
    all_reduce: str = "nccl"                # nccl | custom (vLLM's one-shot / two-shot kernels)
    custom_all_reduce_max_bytes: float = 8 * 2 ** 20   # larger messages go to NCCL
    one_shot_max_bytes_4: float = 512 * 2 ** 10        # 3-4 GPUs: one-shot below this, else two-shot
    one_shot_max_bytes_8: float = 256 * 2 ** 10        # 5-8 GPUs: idem
    one_shot_latency: float = 0.0           # seconds a one-shot all-reduce costs however small
    two_shot_latency: float = 0.0           # seconds a two-shot all-reduce costs however small
    custom_all_reduce_bandwidth: Optional[float] = None   # bytes/s each GPU reads from its peers (None: the link's)
    collective_overhead: float = 0.0        # seconds added to every NCCL collective (eager launch, rank skew)
    client_latency: float = 0.0             # seconds between the client and the engine, in and out
    non_kv_memory: float = 0.0              # bytes per GPU neither weights nor KV (activation peak, CUDA context)
    non_kv_memory_parallel: float = 0.0     # bytes more per GPU of a TP/PP group (communication buffers)

    def describe(self) -> dict:
        return asdict(self)


def decode_split(value) -> str:
    """`decode_split_kv` as one of DECODE_SPLITS (the former booleans, as bools or as OmegaConf's strings,
    mean always / never); anything else is refused by name."""
    name = str(value).lower()
    name = SPLIT_SPELLINGS.get(name, name)
    if name not in DECODE_SPLITS:
        raise ValueError(f"serving_engine.decode_split_kv must be one of {', '.join(DECODE_SPLITS)}, got {value!r}")
    return name


def check_serving_engine(e: ServingEngineConfig) -> None:
    """Refuse constants that would give a step a time that is not finite and >= 0, naming the key."""
    decode_split(e.decode_split_kv)
    if e.fused_moe_config not in FUSED_MOE_CONFIGS:
        raise ValueError(f"serving_engine.fused_moe_config must be one of {', '.join(FUSED_MOE_CONFIGS)}, "
                         f"got '{e.fused_moe_config}'")
    if e.all_reduce not in ALL_REDUCES:
        raise ValueError(f"serving_engine.all_reduce must be one of {', '.join(ALL_REDUCES)}, got '{e.all_reduce}'")
    k0 = e.fused_moe_tile_overhead
    if k0 is not None and not (isinstance(k0, (int, float)) and 0 <= k0 < math.inf):
        raise ValueError(f"serving_engine.fused_moe_tile_overhead must be a finite number >= 0 (K's worth of fixed "
                         f"work per output tile) or null (the kernel's measured), got {k0!r}")
    if k0 is not None and not e.fused_moe_tiles:
        raise ValueError(f"serving_engine.fused_moe_tile_overhead={k0!r} needs serving_engine.fused_moe_tiles=true: "
                         f"it is a term of vLLM's fused-MoE kernel, which prices nothing without it")
    if not 0 < e.prefill_attention_efficiency <= 1 or not 0 <= e.prefill_attention_tile_overhead < math.inf:
        raise ValueError("serving_engine.prefill_attention_efficiency must be in (0, 1] and "
                         "serving_engine.prefill_attention_tile_overhead a finite number of keys >= 0, got "
                         f"{e.prefill_attention_efficiency!r} and {e.prefill_attention_tile_overhead!r}")
    for name in ("host_per_step", "host_per_request", "host_per_token", "kernel_launch", "one_shot_latency",
                 "two_shot_latency", "collective_overhead", "client_latency", "custom_all_reduce_max_bytes",
                 "one_shot_max_bytes_4", "one_shot_max_bytes_8", "non_kv_memory", "non_kv_memory_parallel"):
        value = getattr(e, name)
        if not (isinstance(value, (int, float)) and 0 <= value < math.inf):
            raise ValueError(f"serving_engine.{name} must be a finite number >= 0, got {value!r}")
    if e.decode_attention_floor is not None and not 0 <= e.decode_attention_floor < math.inf:
        raise ValueError(f"serving_engine.decode_attention_floor must be null or a finite number of seconds >= 0, "
                         f"got {e.decode_attention_floor!r}")
    p = e.async_overlap_norm
    if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 1 <= p < math.inf):
        raise ValueError(f"serving_engine.async_overlap_norm must be null (host work fully hidden behind the GPU) "
                         f"or a finite number >= 1 (1: none hidden), got {p!r}")
    if p is not None and not e.async_scheduling:
        raise ValueError(f"serving_engine.async_overlap_norm={p!r} needs serving_engine.async_scheduling=true: only "
                         f"there does host work overlap the GPU (without it the step is host + kernels already)")
    bw = e.custom_all_reduce_bandwidth
    if bw is not None and not (isinstance(bw, (int, float)) and 0 < bw < math.inf):
        raise ValueError(f"serving_engine.custom_all_reduce_bandwidth must be null (the link's) or a finite number "
                         f"of bytes/s > 0, got {bw!r}")
    if not (isinstance(e.cuda_graph_max_tokens, int) and e.cuda_graph_max_tokens >= 0):
        raise ValueError(f"serving_engine.cuda_graph_max_tokens must be a whole number >= 0, "
                         f"got {e.cuda_graph_max_tokens!r}")


class ServingEngine:
    """The preset's terms as the cost models use them (module doc)."""

    def __init__(self, cfg: Optional[ServingEngineConfig] = None):
        cfg = cfg or ServingEngineConfig()
        check_serving_engine(cfg)
        self.cfg = cfg = replace(cfg, decode_split_kv=decode_split(cfg.decode_split_kv))   # one spelling each
        self.name = cfg.name
        self.async_scheduling = cfg.async_scheduling
        self.overlap_norm = cfg.async_overlap_norm
        if self.overlap_norm is not None:          # (refused without async scheduling: check_serving_engine)
            self.step = self._partly_overlapped_step
        self.host_per_step, self.host_per_request, self.host_per_token = \
            cfg.host_per_step, cfg.host_per_request, cfg.host_per_token
        self.launch = cfg.kernel_launch
        self.is_none = cfg == ServingEngineConfig(name=cfg.name)   # kernel time only: the engine-less model

    def describe(self) -> str:
        """What a run's summary records of its engine: the preset's name (the config echo beside it
        has every constant)."""
        return self.cfg.name

    @property
    def has_host_time(self) -> bool:
        return bool(self.host_per_step or self.host_per_request or self.host_per_token or self.launch)

    def custom_all_reduce(self, tp: int, size: float, link_bandwidth: float) -> Optional[float]:
        """vLLM's custom all-reduce of `size` bytes over `tp` GPUs, or None where vLLM uses NCCL."""
        c = self.cfg
        if c.all_reduce != "custom" or tp not in CUSTOM_WORLD_SIZES or size >= c.custom_all_reduce_max_bytes:
            return None
        bw = c.custom_all_reduce_bandwidth or link_bandwidth
        one_shot = tp == 2 or size < (c.one_shot_max_bytes_4 if tp <= 4 else c.one_shot_max_bytes_8)
        if one_shot:
            return c.one_shot_latency + (tp - 1) * size / bw
        return c.two_shot_latency + 2 * (tp - 1) / tp * size / bw

    def launches(self, kernels: int, tokens: int, decode_only: bool, attention_kernels: int) -> float:
        """Host seconds launching a step's kernels: none in a full graph, the attention kernels in a
        piecewise one, all of them outside graphs."""
        if not self.launch:
            return 0.0
        c = self.cfg
        if c.cuda_graphs and tokens <= c.cuda_graph_max_tokens:
            return self.launch if decode_only else self.launch * (attention_kernels + 1)
        return self.launch * kernels

    def step(self, gpu: float, launches: float, host: float) -> float:
        """A step's duration from its kernel time, its launch time and its other host work."""
        if self.async_scheduling:
            busy = launches + host
            return busy if busy > gpu else gpu
        return host + (launches if launches > gpu else gpu)

    def _partly_overlapped_step(self, gpu: float, launches: float, host: float) -> float:
        """`step` under async scheduling with `async_overlap_norm` p: the p-norm of kernels and host work."""
        busy = launches + host
        if busy > 0:
            p = self.overlap_norm
            return (gpu ** p + busy ** p) ** (1 / p)
        return gpu
