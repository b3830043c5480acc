"""One typed config per data plane: the `dataplane` group names its plane by `_target_`.

configs/dataplane/sim.yaml and torch.yaml each carry `_target_` (the plane's class) and every
key of that plane's dataclass below, so `dataplane=sim dataplane.tensor_parallel=4` and
`dataplane.timer=cpu` work as before, and a key of the other plane (`dataplane=sim
dataplane.device=cuda`) is refused naming the plane's keys instead of being carried silently.
A plane of your own is `_target_: mypkg.MyPlane`, a class with a `Config` dataclass and
`MyPlane(model, hardware, config, seed)`; see docs/design.md.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from difflib import get_close_matches
from importlib import import_module
from typing import ClassVar, Optional

from policylab.dataplane.serving_engine import ServingEngineConfig

SIM_TARGET = "policylab.dataplane.sim.SimDataPlane"
TORCH_TARGET = "policylab.dataplane.torch_plane.TorchDataPlane"


@dataclass
class SimPlaneConfig:
    """`dataplane=sim`: a cost model times every step; no model runs."""
    target: ClassVar[str] = SIM_TARGET
    kind: str = "sim"
    cost_model: str = "shaped"      # shaped (the default) | roofline | kernel (docs/cost-model.md)
    calibration: Optional[str] = None     # fitted cost-model file replacing the roofline
    profile: Optional[str] = None   # directory of a Vidur compute profile (mlp.csv [+ attention.csv])
    network_profile: Optional[str] = None   # with profile: directory with Vidur's all_reduce.csv
    tensor_parallel: int = 1        # GPUs per pipeline stage
    pipeline_parallel: int = 1      # pipeline stages (layers split evenly; GPUs = tp x pp)
    gpu_memory_utilization: float = 0.9   # share of device memory for weights + KV
    kv_cache_memory_bytes: Optional[float] = None   # KV bytes per GPU, as vLLM's --kv-cache-memory-bytes (None:
                                    # what gpu_memory_utilization leaves after the weights and the engine's own)
    time_noise: float = 0.0         # each step's duration x (1 + time_noise x N(0,1)) (0: exact)
    time_noise_seed: int = 0
    # the engine the steps run in: the run's `serving_engine` group, set by the app layer (None: kernel
    # time only, as `serving_engine=none`; policylab/dataplane/serving_engine.py)
    serving_engine: Optional[ServingEngineConfig] = None
    weight_dtype: str = "auto"      # auto (the model's dtype_bytes) | bf16 | fp16 | fp8 | int8 | int4 (quant=...)
    kv_cache_dtype: str = "auto"    # auto | bf16 | fp16 | fp8 (kv_dtype=fp8): bytes per KV element, KV capacity
    compute_dtype: str = "auto"     # auto | bf16 | fp16 | fp8 | int8: the GEMMs' tensor-core peak (W8A8)
    gpu_clock_mhz: Optional[float] = None   # SM clock (None: the GPU's max_clock_mhz): slower compute, less power
    power_limit: str = "cap"        # cap: power held at the TDP | throttle: the clock drops until a step fits it


@dataclass
class TorchPlaneConfig:
    """`dataplane=torch`: a real paged-KV transformer computes every token."""
    target: ClassVar[str] = TORCH_TARGET
    kind: str = "torch"
    device: str = "auto"            # auto | cpu | cuda
    attention: str = "torch"        # torch | flash_attn | triton
    dtype: str = "auto"             # auto: float32 on CPU, bfloat16 on CUDA
    kv_cache_gb: float = 0.25       # on CPU: KV cache size
    gpu_memory_utilization: float = 0.9   # on CUDA: share of device memory for weights + KV
    cuda_graphs: Optional[bool] = None    # decode steps replay CUDA graphs; None: on CUDA with attention=triton
    threads: Optional[int] = None   # on CPU: intra-op threads (None: 1 on <= 4 cores, else torch default)
    step_time: str = "measured"     # auto (model on CPU, measured on CUDA; configs/dataplane/torch.yaml's
                                    # default) | measured | model (a sim cost model times each step: machine-independent)
    cost_model: str = "shaped"      # step_time=model: the sim cost model that times the steps
    calibration: Optional[str] = None     # step_time=model and fidelity: a fitted cost model to time them by
    timer: str = "wall"             # wall (perf_counter) | cpu (thread CPU time, one intra-op thread)
    timer_repeats: int = 1          # timer=cpu: run each step k times, keep the least time
    timer_reference: bool = False   # timer=cpu: scale each step by a reference step's best / current time
    weight_dtype: str = "auto"      # auto (dtype) | int8 | fp8 | int4: decoder linear weights stored quantised
    kv_cache_dtype: str = "auto"    # auto (dtype) | fp8: the KV cache stored in FP8 with per-token, per-head scales
    compute_dtype: str = "auto"     # auto | int8 | fp8: activations quantised per token too (W8A8)
    gpu_clock_mhz: Optional[float] = None   # step_time=model: the modelled GPU's SM clock
    power_limit: str = "cap"        # step_time=model: cap | throttle (policylab.dataplane.energy)
    quality_reference: str = "auto"  # auto (when any dtype is quantised) | always | never: a full-precision
                                     # copy of the model scores every step (quality.* in summary.json)

    def model_timing(self) -> SimPlaneConfig:
        """The sim config that times this plane's steps under step_time=model (same precision and clock)."""
        return SimPlaneConfig(cost_model=self.cost_model, calibration=self.calibration,
                              gpu_memory_utilization=self.gpu_memory_utilization, weight_dtype=self.weight_dtype,
                              kv_cache_dtype=self.kv_cache_dtype, compute_dtype=self.compute_dtype,
                              gpu_clock_mhz=self.gpu_clock_mhz, power_limit=self.power_limit)


@dataclass
class VllmPlaneConfig:
    """`dataplane=vllm`: vLLM's own engine serves the model, the policy as its scheduler
    (policylab.integrations.vllm; the app layer runs it, so it has no plane class here)."""
    target: ClassVar[str] = ""
    kind: str = "vllm"
    device: str = "auto"            # auto | cpu | cuda (vLLM's build decides)
    dtype: str = "auto"             # auto: float32 on CPU
    kv_cache_gb: float = 1.0        # CPU: vLLM's KV cache space (VLLM_CPU_KVCACHE_SPACE, GiB) unless set
    gpu_memory_utilization: float = 0.9   # CUDA: vLLM's share of device memory
    calibration: Optional[str] = None     # fidelity: a fitted cost model for the sim side


PLANES = {"sim": SimPlaneConfig, "torch": TorchPlaneConfig, "vllm": VllmPlaneConfig}
TARGETS = {c.target: c for c in PLANES.values() if c.target}     # the shipped planes with a class
PLANE_OF: dict = {}      # a user plane's Config dataclass -> its plane class (filled as configs are read)


def config_class(target: Optional[str], kind: Optional[str]):
    """The config dataclass of the plane `_target_` (or, without one, `kind`) names."""
    if target:
        if target in TARGETS:
            return TARGETS[target]
        module, _, name = target.rpartition(".")
        try:
            plane = getattr(import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            raise ValueError(f"dataplane._target_={target}: no such importable class") from None
        if not hasattr(plane, "Config"):
            raise ValueError(f"dataplane._target_={target}: a data plane class needs a `Config` dataclass")
        PLANE_OF[plane.Config] = plane
        return plane.Config
    if kind not in PLANES:
        raise ValueError(f"dataplane.kind must be one of {', '.join(PLANES)}, got '{kind}'")
    return PLANES[kind]


def plane_config(node: dict):
    """A composed `dataplane` node (a dict) as its plane's typed config; a key the plane does not
    have is refused, naming the plane's keys (and the closest one)."""
    node = dict(node)
    target = node.pop("_target_", None)
    cls = config_class(target, node.get("kind"))
    kind = node.get("kind")
    if target and kind is not None and kind != cls.kind and kind in PLANES:
        raise ValueError(f"dataplane.kind={kind} but dataplane._target_ is the {cls.kind} plane ({target}): "
                         f"choose the plane with dataplane={kind}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(k for k in node if k not in known)
    if unknown:
        close = get_close_matches(unknown[0], known, n=1)
        other = [kind for kind, c in PLANES.items() if c is not cls and unknown[0] in {f.name for f in fields(c)}]
        hint = (f" (did you mean dataplane.{close[0]}?)" if close else
                f" (a key of dataplane={other[0]})" if other else "")
        raise ValueError(f"dataplane.{unknown[0]} is not a key of the {cls.__name__} data plane{hint}; "
                         f"it has {', '.join(sorted(known))}")
    return cls(**node)


def DataplaneConfig(kind: str = "torch", **values):     # noqa: N802 (reads as the config it builds)
    """The config of the `kind` plane with `values` (code and tests; runs compose it from YAML)."""
    return plane_config({"kind": kind, **values})
