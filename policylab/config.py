"""Typed Hydra configuration (structured configs registered in Hydra's ConfigStore).

The YAML files under `configs/` pick group options; these dataclasses give every
field a type and a default so a typo or a wrong type fails before the run starts.
Group options whose fields differ per option (policy, dataplane, model, hardware,
logger) are typed by their own dataclasses, validated when they are built.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from policylab.capacity import CapacityConfig
from policylab.traces.config import TraceConfig


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


@dataclass
class SloConfig:
    ttft: float = 2.0      # seconds; a trace's per-request ttft_slo wins
    tpot: float = 0.2      # seconds per output token; a trace's tpot_slo wins


@dataclass
class FairnessConfig:
    w_in: float = 1.0
    w_out: float = 2.0


@dataclass
class ModelConfig:
    """Architecture (HF names) plus where the weights come from. The sim data plane uses the shape only."""
    name: str = "tiny"
    source: str = "random"          # random (seeded) | hf_dir | gguf | shape_only (sim only)
    path: Optional[str] = None      # hf_dir: directory; gguf: file, or 'auto' to find a packaged one
    architecture: str = "llama"     # llama | qwen2 | mistral
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


@dataclass
class HardwareConfig:
    """Accelerator spec for the sim roofline (public datasheet numbers, dense)."""
    name: str = "h100"
    peak_flops: float = 989e12      # FLOP/s, bf16 dense
    mem_bandwidth: float = 3.35e12  # bytes/s
    mem_bytes: float = 80e9
    flops_efficiency: float = 0.6   # achievable share of peak in GEMMs
    bw_efficiency: float = 0.8      # achievable share of peak bandwidth
    step_overhead: float = 0.004    # seconds per step: launch, sampling, scheduling on the host


@dataclass
class DataplaneConfig:
    kind: str = "torch"             # torch | sim
    device: str = "auto"            # torch: auto | cpu | cuda
    attention: str = "torch"        # torch | flash_attn
    dtype: str = "auto"             # auto: float32 on CPU, bfloat16 on CUDA
    kv_cache_gb: float = 0.25       # torch on CPU: KV cache size
    gpu_memory_utilization: float = 0.9   # torch on CUDA / sim: share of device memory for weights + KV
    cuda_graphs: Optional[bool] = None    # decode steps replay CUDA graphs; None: on CUDA with attention=triton
    calibration: Optional[str] = None     # sim: fitted cost-model file replacing the roofline
    threads: Optional[int] = None   # torch on CPU: intra-op threads (None: torch default)


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


@dataclass
class GenerateConfig:
    """`python -m policylab generate prompt=...`: one real prompt through the full engine."""
    prompt: str = "The capital of France is"
    max_new_tokens: int = 48
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    chat: bool = False              # wrap the prompt as a user turn of the model's chat template


@dataclass
class RunConfig:
    seed: int = 0
    engine: EngineConfig = field(default_factory=EngineConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    fairness: FairnessConfig = field(default_factory=FairnessConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    policy: Any = MISSING           # {_target_: importable Policy class, name: ..., **params}
    dataplane: DataplaneConfig = field(default_factory=DataplaneConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    capacity: CapacityConfig = field(default_factory=CapacityConfig)   # `policylab capacity` search
    generate: GenerateConfig = field(default_factory=GenerateConfig)   # `policylab generate`
    progress: bool = True        # progress bar over requests
    plots: bool = True           # PNG plots in the run directory


def register() -> None:
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)


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
