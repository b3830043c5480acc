"""A model's shape read from its Hugging Face `config.json` (`model=hf model.config=PATH`).

The simulator needs a model's shape only: layers, widths, heads, KV heads, experts, latent
attention. Every Hugging Face checkpoint states them in its `config.json`, under names that
differ by family; this module maps the families a serving researcher meets to `ModelConfig`:

- dense and GQA: `llama`, `mistral`, `qwen2`, `qwen3`, `gemma`, `phi3` (hidden_size,
  intermediate_size, num_attention_heads, num_key_value_heads (default: the heads), head_dim
  (default: hidden / heads));
- mixture of experts: `mixtral` (num_local_experts, num_experts_per_tok, every expert as wide as
  intermediate_size), `qwen2_moe` / `qwen3_moe` (num_experts, moe_intermediate_size, a shared
  expert of shared_expert_intermediate_size), `deepseek_v2` / `deepseek_v3` (n_routed_experts,
  n_shared_experts, first_k_dense_replace);
- multi-head latent attention: `deepseek_v2` / `deepseek_v3` (kv_lora_rank, q_lora_rank,
  qk_rope_head_dim, qk_nope_head_dim as the head size, v_head_dim);
- `phi` (phi-2: the GELU MLP, one LayerNorm feeding attention and MLP).

Weights count 2 bytes (vLLM serves float32 checkpoints in 16 bits); a checkpoint quantized to
FP8 (`quantization_config.quant_method: fp8`) counts 1, as DeepSeek-V3's release. What the
simulator does not price (sliding windows, vision towers, multi-token-prediction layers) is left out.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from policylab.core.config import ModelConfig

DENSE = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "granite", "olmo2", "internlm2"}
MOE = {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3"}
FAMILIES = sorted(DENSE | MOE | {"phi"})
TEXT_CONFIG_KEYS = ("text_config", "language_config", "llm_config")   # multimodal wrappers


class HfConfigError(ValueError):
    """A config.json that does not describe a model the simulator can price; names the file and key."""


def read_hf_config(path: str | Path) -> dict:
    """The JSON object of `path` (a config.json, or a directory holding one)."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise HfConfigError(f"model.config={path}: no such file (a Hugging Face config.json, or its directory)")
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HfConfigError(f"{p}: not a JSON file ({e})") from None
    if not isinstance(data, dict):
        raise HfConfigError(f"{p}: a config.json holds a JSON object, got {type(data).__name__}")
    return data


def model_from_hf_config(path: str | Path, base: ModelConfig | None = None) -> ModelConfig:
    """`base` (default: a fresh ModelConfig) with the shape `path`'s config.json gives."""
    data = read_hf_config(path)
    name = Path(str(data.get("_name_or_path") or Path(path).expanduser().resolve().parent.name)).name or "hf"
    shape = shape_from_hf_dict(data, str(path))
    base = base or ModelConfig()
    return replace(base, name=base.name if base.name not in ("hf", "") else name, **shape)


def shape_from_hf_dict(data: dict, where: str = "config.json") -> dict:
    """ModelConfig fields of a config.json's object (a multimodal model's text part)."""
    for key in TEXT_CONFIG_KEYS:
        if isinstance(data.get(key), dict) and "hidden_size" in data[key]:
            data = {**data[key], "model_type": data[key].get("model_type", data.get("model_type"))}
            break
    family = str(data.get("model_type", "llama")).lower()
    if family not in DENSE and family not in MOE and family != "phi":
        raise HfConfigError(f"{where}: model_type '{family}' is not one the simulator prices; known: "
                            f"{', '.join(FAMILIES)} (a llama-like model: set its model_type to llama)")

    def need(key: str, kind=int):
        if key not in data or data[key] is None:
            raise HfConfigError(f"{where}: no '{key}' (a {family} config.json states it)")
        try:
            value = kind(data[key])
        except (TypeError, ValueError):
            raise HfConfigError(f"{where}: '{key}'={data[key]!r} is not a number") from None
        if value <= 0:
            raise HfConfigError(f"{where}: '{key}' must be > 0, got {data[key]!r}")
        return value

    heads = need("num_attention_heads")
    hidden = need("hidden_size")
    eos = data.get("eos_token_id")
    out = dict(
        source="shape_only", path=None,
        architecture="phi" if family == "phi" else ("qwen2" if family.startswith("qwen2") else "llama"),
        hidden_size=hidden, num_hidden_layers=need("num_hidden_layers"), num_attention_heads=heads,
        num_key_value_heads=int(data.get("num_key_value_heads") or heads),
        head_dim=int(data.get("head_dim") or hidden // heads), vocab_size=need("vocab_size"),
        max_position_embeddings=int(data.get("max_position_embeddings") or 4096),
        rope_theta=float(data.get("rope_theta") or 10000.0), rope_scaling=data.get("rope_scaling"),
        rms_norm_eps=float(data.get("rms_norm_eps") or data.get("layer_norm_eps") or 1e-5),
        tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
        attention_bias=bool(data.get("attention_bias", family.startswith("qwen2"))),
        dtype_bytes=1 if _fp8(data) else 2,
        eos_token_id=(eos[0] if isinstance(eos, list) and eos else eos if isinstance(eos, int) else None),
    )
    out["intermediate_size"] = int(data.get("intermediate_size") or data.get("moe_intermediate_size") or 4 * hidden)
    if family == "mixtral":
        out.update(num_experts=need("num_local_experts"), num_experts_per_tok=need("num_experts_per_tok"),
                   moe_intermediate_size=need("intermediate_size"))
    elif family in ("qwen2_moe", "qwen3_moe"):
        shared = int(data.get("shared_expert_intermediate_size") or 0)
        moe_f = need("moe_intermediate_size")
        out.update(num_experts=need("num_experts"), num_experts_per_tok=need("num_experts_per_tok"),
                   moe_intermediate_size=moe_f, num_shared_experts=-(-shared // moe_f) if shared else 0)
    elif family in ("deepseek_v2", "deepseek_v3"):
        out.update(num_experts=need("n_routed_experts"), num_experts_per_tok=need("num_experts_per_tok"),
                   moe_intermediate_size=need("moe_intermediate_size"),
                   num_shared_experts=int(data.get("n_shared_experts") or 0),
                   first_dense_layers=int(data.get("first_k_dense_replace") or 0),
                   kv_lora_rank=need("kv_lora_rank"), q_lora_rank=int(data.get("q_lora_rank") or 0),
                   qk_rope_head_dim=need("qk_rope_head_dim"), head_dim=need("qk_nope_head_dim"),
                   v_head_dim=need("v_head_dim"))
    return out


def _fp8(data: dict) -> bool:
    q = data.get("quantization_config")
    return isinstance(q, dict) and str(q.get("quant_method", "")).lower() == "fp8"
