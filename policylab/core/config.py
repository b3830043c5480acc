"""Plain typed configuration of the core, the data planes and the analysis.

(Each data plane's config lives with the planes: policylab.dataplane.config.)
These dataclasses know nothing of Hydra: the app layer (`policylab.apps.config`) registers
them as structured configs and converts the composed config into them once, so every layer
below reads ordinary attributes (an OmegaConf node costs a resolver call per read).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from policylab.core.kv.tiers import check_tier_config
from policylab.core.kv.host import make_link



@dataclass
class EngineConfig:
    block_size: int = 16
    num_blocks: Optional[int] = None        # None: as many as the data plane can hold
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    max_model_len: int = 8192               # configs/config.yaml: the model's context length (as vLLM)
    enable_prefix_caching: bool = True
    clock: str = "virtual"                  # virtual | wall
    max_tokens: Optional[int] = None        # cap shown to policies; None: max_model_len - prompt
    predictor: str = "none"                 # output-length prediction shown to policies: none | oracle
    predictor_noise: float = 0.0            # lognormal sigma applied to the oracle prediction
    stop_at_eos: bool = False               # real data plane: finish on EOS instead of trace length
    check_invariants: bool = False          # assert KV accounting after every step (tests)
    max_stall_steps: int = 100_000          # steps without any output or completion = livelock
    prefix_cache: str = "hash"              # prefix index: hash (chained block hashes) | radix (token tree)
    host_kv_blocks: int = 0                 # host-memory KV blocks for swap preemption (0: swap off)
    swap_link: str = "pcie4"                # device-host link preset: pcie4 | pcie5 | nvlink_c2c
    swap_bandwidth: Optional[float] = None  # bytes/s one way, overriding the preset's
    swap_latency: Optional[float] = None    # seconds per step that moves KV, overriding the preset's
    swap_overlap: bool = False              # the copy hides behind the step's compute (max, not sum)
    prefix_host_blocks: int = 0             # host tier under the prefix cache: evicted blocks offloaded (0: off)
    prefix_disk_blocks: int = 0             # disk tier under the host tier (0: none)
    prefix_disk: str = "nvme_gen4"          # disk preset: nvme_gen4 | nvme_gen5
    prefix_disk_path: Optional[str] = None  # torch plane: directory of the disk tier's file (None: temp dir)
    parallel_samples: int = 0               # samples per request, overriding the trace's `n` (0: the trace's)
    beam_width: int = 0                     # beams per request, overriding the trace's `beam_width` (0: the trace's)
    length_limit: Optional[str] = None      # prompt + output beyond max_model_len: reject (on arrival) | stop
                                            # (vLLM's: run, stop at the limit); None: the policy's, else reject
    publish_on_schedule: Optional[bool] = None  # a prompt's full blocks enter the prefix cache when
                                            # scheduled (vLLM's way: requests admitted in the same step
                                            # hit them), not once computed; None: the policy's, else off
    tool_kv: str = "policy"                 # KV of a request paused for a tool call: policy (its
                                            # on_tool_call hook) | keep | free | offload (forced)


@dataclass
class SloConfig:
    ttft: float = 2.0      # seconds; a trace's per-request ttft_slo wins
    tpot: float = 0.2      # seconds per output token; a trace's tpot_slo wins


@dataclass
class QoeConfig:
    """What a streaming user expects (Andes' QoE, policylab/analysis/qoe.py): the first token
    within `ttft` s, then `tds` tokens/s (a reading pace: ~240 words a minute, ~1.3 tokens a word)."""
    ttft: float = 1.0      # seconds
    tds: float = 5.0       # tokens per second


@dataclass
class FairnessConfig:
    w_in: float = 1.0
    w_out: float = 2.0
    window: Optional[float] = None      # seconds per fairness window (None: 1/20 of the run)


@dataclass
class ModelConfig:
    """Architecture (HF names) plus where the weights come from. The sim data plane uses the shape only."""
    name: str = "tiny"
    source: str = "random"          # random (seeded) | hf_dir | gguf | shape_only (sim only)
    path: Optional[str] = None      # hf_dir: directory; gguf: file, or 'auto' to find a packaged one
    config: Optional[str] = None    # a Hugging Face config.json the shape is read from (model=hf; sim)
    architecture: str = "llama"     # llama | qwen2 | mistral (real and sim); phi (sim only: GELU MLP, parallel block)
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: Optional[int] = None  # None: hidden_size // num_attention_heads
    vocab_size: int = 32000
    max_position_embeddings: int = 8192
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None   # e.g. Llama-3 {rope_type: llama3, factor: 8, ...}
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    attention_bias: bool = False    # q/k/v bias (Qwen2)
    dtype_bytes: int = 2            # bytes per weight/KV element, for the sim cost model
    eos_token_id: Optional[int] = None
    # mixture of experts (sim only; 0: a dense MLP of intermediate_size)
    num_experts: int = 0            # routed experts per MoE layer
    num_experts_per_tok: int = 0    # top-k routing
    moe_intermediate_size: int = 0  # one expert's MLP width
    num_shared_experts: int = 0     # experts every token passes through (DeepSeek)
    first_dense_layers: int = 0     # leading layers with the dense MLP (DeepSeek-V3: 3)
    # multi-head latent attention (sim only; kv_lora_rank 0: no MLA)
    kv_lora_rank: int = 0           # cached latent per token per layer (+ qk_rope_head_dim)
    q_lora_rank: int = 0            # 0: a full-rank query projection
    qk_rope_head_dim: int = 0
    v_head_dim: Optional[int] = None   # None: head_dim


@dataclass
class HardwareConfig:
    """Accelerator spec for the sim roofline: peaks from the public datasheet (H100 SXM, dense bf16),
    efficiencies and kernel latency measured on Vidur's H100 kernel times of six models
    (configs/hardware/*.yaml gives each GPU's source and measurement)."""
    name: str = "h100"
    peak_flops: float = 989e12      # FLOP/s, bf16 dense
    mem_bandwidth: float = 3.35e12  # bytes/s
    mem_bytes: float = 85.06e9     # bytes per GPU as CUDA reports them (what gpu_memory_utilization multiplies)
    flops_efficiency: float = 0.68  # achieved share of peak in FLOP-bound GEMMs (see configs/hardware/h100.yaml)
    bw_efficiency: float = 0.90     # achieved share of peak bandwidth streaming weights (idem)
    kernel_latency: float = 4.8e-6  # seconds every kernel costs however small (launch, fill, tail; idem)
    step_overhead: float = 0.0      # seconds per step of host time not hidden (the profile is kernel time only)
    host_per_request: float = 0.0   # host seconds per scheduled request (configs/host/: engine presets)
    host_per_token: float = 0.0     # host seconds per scheduled token
    host: Optional[str] = None      # the host-time preset these three came from (configs/host/)
    num_sms: int = 132              # streaming multiprocessors (CUs): wave quantisation, attention work split
    link: str = "nvlink4"           # GPU-to-GPU link of a tensor/pipeline-parallel group (configs/link/)
    link_bandwidth: float = 329e9   # bytes/s of ring bus bandwidth (configs/hardware/h100.yaml: measured)
    link_latency: float = 0.79e-6   # seconds per ring hop
    collective_latency: float = 18.3e-6   # seconds per collective, however small
    # cost_model=kernel only (configs/hardware/*.yaml gives each one's source)
    gemm_efficiency: float = 0.77   # share of peak FLOP/s of a large GEMM whose tiles fill every SM
    gemm_tile_m: int = 128          # output tile of a large GEMM: rows (tokens) ...
    gemm_tile_n: int = 256          # ... and columns
    attention_floor: float = 11e-6  # seconds an attention kernel takes however little it does
    attention_efficiency: float = 0.60   # share of peak FLOP/s of FlashAttention-style prefill
    # cost_model=shaped (the default) also uses these (idem)
    curve_efficiency: float = 0.73  # share of peak FLOP/s of a GEMM in whole tile waves (the shaped curve)
    gemm_half_m: float = 0.0        # each GEMM's fixed pipeline fill, in tokens of work
    gemm_wave_tile_m: int = 128     # output tile the shaped GEMM's waves are made of: rows (tokens) ...
    gemm_wave_tile_n: int = 128     # ... and columns
    persistent_gemm_efficiency: Optional[float] = None   # share of peak FLOP/s of the persistent (stream-K)
                                    # GEMMs recent libraries run from one full wave up (None, the default: the GPU has none
                                    # unless its preset declares them)
    fused_moe_default_bw_efficiency: Optional[float] = None   # share of peak bandwidth vLLM's default (untuned)
                                    # fused-MoE tiles stream the experts at (None: not measured on this GPU)
    fused_moe_default_floor: Optional[float] = None   # seconds those tiles add per MoE layer (idem)
    decode_attention_floor: float = 20e-6   # seconds a paged-decode attention kernel takes however little it does
    decode_attention_blocks_per_sm: float = 3.0   # thread blocks per SM a split-KV planner fills (its grid, with num_sms)
    attention_length_slope: float = 0.065   # prefill attention efficiency lost per halving of the chunk below 16k
    elementwise_bw_efficiency: float = 0.56  # achieved share of peak bandwidth of the norms, RoPE, activation, adds
    elementwise_latency: float = 2.3e-6      # seconds each of those kernels costs however small
    # precision and energy (policylab.dataplane.precision / .energy; configs/hardware/*.yaml cites each)
    peak_flops_fp8: Optional[float] = 1978.9e12   # dense FP8 tensor FLOP/s (None: no FP8 tensor cores)
    peak_flops_int8: Optional[float] = 1978.9e12  # dense INT8 tensor OP/s (None: no INT8 tensor cores)
    max_clock_mhz: Optional[float] = 1980    # SM boost clock the peaks are quoted at (None: no clock knob)
    min_clock_mhz: Optional[float] = 990     # lowest SM clock the knob accepts
    idle_power: Optional[float] = 70         # W drawn with nothing running (None: no energy model)
    max_power: Optional[float] = 700         # W the board is limited to (TDP)
    active_power: float = 291                # W the clocked SMs add while they run kernels, at max clock
    compute_power: float = 2641             # W more at full tensor-core utilisation, at max clock
    memory_power: float = 106                # W more at full memory-bandwidth utilisation
    clock_power_exponent: float = 1.0        # SM-side power scales as (clock / max_clock) ** this


@dataclass
class LoggerConfig:
    kind: str = "wandb"             # wandb | none
    mode: str = "offline"           # offline | online | disabled
    project: str = "policylab"
    entity: Optional[str] = None
    group: Optional[str] = None     # None: the sweep's directory name in multirun
    tags: list = field(default_factory=list)
    max_history_points: int = 2000
    dir: Optional[str] = None       # None: the run directory


def check_engine_config(cfg: EngineConfig) -> None:
    """Budgets that cannot work together fail before the run, naming the field."""
    for name in ("block_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len", "max_stall_steps"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"engine.{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.max_num_seqs > cfg.max_num_batched_tokens:
        raise ValueError(f"engine.max_num_seqs={cfg.max_num_seqs} exceeds engine.max_num_batched_tokens="
                         f"{cfg.max_num_batched_tokens}: every running decode needs a token of the budget")
    if cfg.num_blocks is not None and cfg.num_blocks < 1:
        raise ValueError(f"engine.num_blocks must be >= 1 or null, got {cfg.num_blocks}")
    if cfg.max_tokens is not None and cfg.max_tokens < 1:
        raise ValueError(f"engine.max_tokens must be >= 1 or null, got {cfg.max_tokens}")
    if cfg.predictor not in ("none", "oracle"):
        raise ValueError(f"engine.predictor must be 'none' or 'oracle', got '{cfg.predictor}'")
    if not 0 <= cfg.predictor_noise < math.inf:
        raise ValueError(f"engine.predictor_noise must be a finite number >= 0 (lognormal sigma), "
                         f"got {cfg.predictor_noise}")
    if cfg.prefix_cache not in ("hash", "radix"):
        raise ValueError(f"engine.prefix_cache must be 'hash' or 'radix', got '{cfg.prefix_cache}'")
    if cfg.parallel_samples < 0:
        raise ValueError(f"engine.parallel_samples must be >= 0 (0: each request's trace `n`), "
                         f"got {cfg.parallel_samples}")
    if cfg.beam_width < 0:
        raise ValueError(f"engine.beam_width must be >= 0 (0: each request's trace `beam_width`), "
                         f"got {cfg.beam_width}")
    if cfg.parallel_samples > 1 and cfg.beam_width > 1:
        raise ValueError(f"engine.parallel_samples={cfg.parallel_samples} and engine.beam_width={cfg.beam_width}: "
                         "every request would fork into samples and into beams; set one of them")
    if cfg.host_kv_blocks < 0:
        raise ValueError(f"engine.host_kv_blocks must be >= 0, got {cfg.host_kv_blocks}")
    make_link(cfg.swap_link, cfg.swap_bandwidth, cfg.swap_latency, cfg.swap_overlap)
    check_tier_config(cfg)
    if cfg.tool_kv not in ("policy", "keep", "free", "offload"):
        raise ValueError(f"engine.tool_kv must be one of policy, keep, free, offload, got '{cfg.tool_kv}'")
    if cfg.length_limit not in (None, "reject", "stop"):
        raise ValueError(f"engine.length_limit must be 'reject' or 'stop' (or null: the policy's), got "
                         f"'{cfg.length_limit}'")
    if cfg.publish_on_schedule is not None and not isinstance(cfg.publish_on_schedule, bool):
        raise ValueError(f"engine.publish_on_schedule must be true or false (or null: the policy's), got "
                         f"'{cfg.publish_on_schedule}'")
    if cfg.clock not in ("virtual", "wall"):
        raise ValueError(f"engine.clock must be 'virtual' or 'wall', got '{cfg.clock}'")


def check_slo_config(slo: SloConfig, fairness: FairnessConfig) -> None:
    """SLOs are positive seconds and fairness weights finite and >= 0 (a NaN SLO meets nothing)."""
    for name in ("ttft", "tpot"):
        value = getattr(slo, name)
        if not 0 < value < math.inf:
            raise ValueError(f"slo.{name} must be a finite number of seconds > 0, got {value}")
    for name in ("w_in", "w_out"):
        value = getattr(fairness, name)
        if not 0 <= value < math.inf:
            raise ValueError(f"fairness.{name} must be a finite number >= 0, got {value}")
