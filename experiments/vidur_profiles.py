"""Vidur's published compute profiles as (GPU, model) cases for the roofline checks.

A Vidur profiling root (`data/profiling` of github.com/microsoft/vidur, or its `compute/`
folder) holds `compute/<gpu>/<org>/<model>/mlp.csv` and, in a full clone, `attention.csv`.
The model's shape comes from the profile's own columns (n_embd, n_head, n_kv_head,
n_expanded_embd, vocab_size, use_gated_mlp); its layer count, which the profile does not
record, from the model's Hugging Face config (LAYERS). The hardware is
`configs/hardware/<gpu>.yaml`, with `step_overhead=0` (the profile is kernel time only); the
serving engine `configs/serving_engine/vidur.yaml` (kernel time only, on the library stack Vidur
profiled with: its H100 GEMMs step at wave boundaries, no persistent kernels), or the one
`--serving-engine` names (`none`: the same kernels on a current library).

Shared by `check_roofline_profiles.py` and `measure_gpu_efficiencies.py`.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from policylab.apps.sim_check import load_group  # noqa: E402
from policylab.core.config import HardwareConfig, ModelConfig  # noqa: E402
from policylab.dataplane.serving_engine import ServingEngine, ServingEngineConfig  # noqa: E402
from policylab.dataplane.profile_csv import floats, read_table  # noqa: E402

# num_hidden_layers of each model's Hugging Face config.json (not in Vidur's CSVs)
LAYERS = {"Llama-2-7b-hf": 32, "Llama-2-70b-hf": 80, "Meta-Llama-3-8B": 32, "Meta-Llama-3-70B": 80,
          "CodeLlama-34b-Instruct-hf": 48, "internlm-20b": 60, "Qwen-72B": 80, "phi-2": 32}
GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
PROFILE_ENGINE = "vidur"    # configs/serving_engine/vidur.yaml: what Vidur's profiles measure


@dataclass
class Case:
    gpu: str
    name: str           # the model folder, e.g. Llama-2-7b-hf
    directory: Path
    model: ModelConfig
    hardware: HardwareConfig
    table: dict         # mlp.csv, TP-1 rows only: column -> list of strings
    engine: ServingEngine = None   # the profiling stack's (PROFILE_ENGINE unless set_engine says otherwise)

    def column(self, name: str) -> np.ndarray:
        return floats(self.table, name, self.directory / "mlp.csv")

    def gemm_shapes(self) -> dict:
        """op -> (K, N) of the GEMMs Vidur times, from the model's shape."""
        m = self.model
        h, f, hd = m.hidden_size, m.intermediate_size, m.hidden_size // m.num_attention_heads
        q, kv = m.num_attention_heads * hd, m.num_key_value_heads * hd
        up = 2 * f if m.architecture != "phi" else f
        return dict(zip(GEMMS, ((h, q + 2 * kv), (q, h), (h, up), (f, h))))


def compute_root(root: Path) -> Path:
    return root / "compute" if (root / "compute").is_dir() else root


def hardware(gpu: str) -> HardwareConfig:
    """configs/hardware/<gpu>.yaml with step_overhead 0 (PyYAML reads `312e12` as a string: made a float)."""
    data = yaml.safe_load((ROOT / "configs" / "hardware" / f"{gpu}.yaml").read_text())
    hw = HardwareConfig(**{k: float(v) if isinstance(v, str) and v[:1].isdigit() else v for k, v in data.items()})
    hw.step_overhead = 0.0
    return hw


def model_of(name: str, table: dict, path: Path) -> ModelConfig:
    """The profiled block's shape. Vidur profiles two blocks: Llama-style (gated MLP, a norm before
    attention and one before the MLP) and phi-2 style (GELU MLP, one norm feeding attention and MLP
    in parallel, no post_attention_layernorm column): architecture 'phi' in policylab's terms."""
    one = {c: floats(table, c, path)[0] for c in ("n_embd", "n_head", "n_kv_head", "n_expanded_embd", "vocab_size")}
    gated = table["use_gated_mlp"][0].strip().lower() in ("true", "1")
    parallel = "time_stats.post_attention_layernorm.median" not in table
    if gated == parallel:
        block = "parallel" if parallel else "sequential"
        raise ValueError(f"{path}: a {'gated' if gated else 'GELU'} MLP in a {block} block: "
                         "neither of the two blocks policylab models")
    if name not in LAYERS:
        raise ValueError(f"{path}: layer count of '{name}' unknown: add it to LAYERS "
                         "(its config.json's num_hidden_layers)")
    return ModelConfig(name=name, source="shape_only", architecture="llama" if gated else "phi",
                       hidden_size=int(one["n_embd"]), intermediate_size=int(one["n_expanded_embd"]),
                       num_hidden_layers=LAYERS[name], num_attention_heads=int(one["n_head"]),
                       num_key_value_heads=int(one["n_kv_head"]), vocab_size=int(one["vocab_size"]),
                       tie_word_embeddings=False)


def override_hardware(found: list, items) -> None:
    """Set FIELD=VALUE on every case's hardware (`null`: the field unset, e.g.
    persistent_gemm_efficiency=null prices a GPU's GEMMs with the wave model alone)."""
    for item in items:
        field, value = item.split("=", 1)
        for case in found:
            setattr(case.hardware, field, None if value.lower() in ("null", "none") else float(value))


def engine(name: str = PROFILE_ENGINE) -> ServingEngine:
    return ServingEngine(load_group("serving_engine", name, ServingEngineConfig))


def set_engine(found: list, name: str) -> None:
    """Price every case inside configs/serving_engine/<name>.yaml (e.g. `none`: current libraries)."""
    chosen = engine(name)
    for case in found:
        case.engine = chosen


def cases(root: Path, gpus=None) -> list:
    """Every <gpu>/<org>/<model>/mlp.csv under the root whose GPU has a configs/hardware file."""
    found = []
    for mlp in sorted(compute_root(root).glob("*/*/*/mlp.csv")):
        gpu, name = mlp.parts[-4], mlp.parts[-2]
        if (gpus and gpu not in gpus) or not (ROOT / "configs" / "hardware" / f"{gpu}.yaml").is_file():
            continue
        full = read_table(mlp, ["num_tokens", "num_tensor_parallel_workers", "n_embd", "use_gated_mlp"])
        tp1 = [w.strip() in ("1", "1.0") for w in full["num_tensor_parallel_workers"]]
        table = {c: [v for v, keep in zip(values, tp1) if keep] for c, values in full.items()}
        found.append(Case(gpu, name, mlp.parent, model_of(name, table, mlp), hardware(gpu), table))
    set_engine(found, PROFILE_ENGINE)
    return found

