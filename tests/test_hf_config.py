"""Model shapes from Hugging Face config.json files (`model=hf model.config=PATH`): dense, GQA, MoE
and MLA families map to the shapes the shipped presets were written from, through the CLI too,
and a config the simulator cannot price is refused naming the file and key."""
from __future__ import annotations

import json
from dataclasses import fields

import pytest

from policylab.apps.config import ConfigError, typed_config
from policylab.apps.python_api import compose
from policylab.apps.sim_check import load_group
from policylab.core.config import ModelConfig
from policylab.dataplane.hf_config import HfConfigError, model_from_hf_config

# the published config.json of each model (the keys the simulator reads, values as published)
LLAMA2_7B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096,
             "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "float16", "bos_token_id": 1,
             "eos_token_id": 2, "_name_or_path": "meta-llama/Llama-2-7b-hf"}
LLAMA2_70B = {**LLAMA2_7B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
              "num_attention_heads": 64, "num_key_value_heads": 8, "_name_or_path": "meta-llama/Llama-2-70b-hf"}
CODELLAMA_34B = {**LLAMA2_7B, "hidden_size": 8192, "intermediate_size": 22016, "num_hidden_layers": 48,
                 "num_attention_heads": 64, "num_key_value_heads": 8, "max_position_embeddings": 16384,
                 "rope_theta": 1000000, "torch_dtype": "bfloat16", "_name_or_path": "codellama/CodeLlama-34b-Instruct-hf"}
MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
           "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 32768,
           "rope_theta": 1e6, "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "eos_token_id": 2,
           "sliding_window": None, "torch_dtype": "bfloat16"}
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
               "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
               "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1,
               "num_experts_per_tok": 8, "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536,
               "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 129280,
               "max_position_embeddings": 163840, "rope_theta": 10000, "rms_norm_eps": 1e-06, "eos_token_id": 1,
               "tie_word_embeddings": False, "quantization_config": {"quant_method": "fp8"}}
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
             "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
             "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
             "rope_theta": 1e6, "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "eos_token_id": 151645}
SHAPE = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
         "head_dim", "vocab_size", "max_position_embeddings", "rope_theta", "tie_word_embeddings", "dtype_bytes",
         "num_experts", "num_experts_per_tok", "moe_intermediate_size", "num_shared_experts", "first_dense_layers",
         "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim")


def write(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.timeout(30)
@pytest.mark.parametrize("data, preset", [(LLAMA2_7B, "llama2-7b"), (LLAMA2_70B, "llama2-70b"),
                                          (CODELLAMA_34B, "codellama-34b"), (MIXTRAL, "mixtral-8x7b"),
                                          (DEEPSEEK_V3, "deepseek-v3")])
def test_config_json_gives_the_shipped_presets_shape(tmp_path, data, preset):
    model = model_from_hf_config(write(tmp_path, data))
    shipped = load_group("model", preset, ModelConfig)
    assert {k: getattr(model, k) for k in SHAPE} == {k: getattr(shipped, k) for k in SHAPE}


@pytest.mark.timeout(30)
def test_moe_and_gqa_families_map_their_own_keys(tmp_path):
    qwen = model_from_hf_config(write(tmp_path, QWEN3_MOE))
    assert (qwen.num_experts, qwen.num_experts_per_tok, qwen.moe_intermediate_size, qwen.head_dim,
            qwen.num_key_value_heads, qwen.num_shared_experts) == (128, 8, 768, 128, 4, 0)
    shipped = load_group("model", "qwen3-30b-a3b", ModelConfig)
    assert {k: getattr(qwen, k) for k in SHAPE if k != "max_position_embeddings"} == \
        {k: getattr(shipped, k) for k in SHAPE if k != "max_position_embeddings"}
    wrapped = write(tmp_path, {"model_type": "llava", "text_config": {**LLAMA2_7B}}, "wrapped.json")
    assert model_from_hf_config(wrapped).hidden_size == 4096            # a multimodal model's text part


@pytest.mark.timeout(60)
def test_the_cli_reads_model_hf_and_a_key_given_on_the_command_line_wins(tmp_path):
    path = write(tmp_path, CODELLAMA_34B)

    def run(*extra):
        cfg = compose(["dataplane=sim", "model=hf", f"model.config={path}", *extra])
        from omegaconf import open_dict
        with open_dict(cfg):
            del cfg["hydra"]
        return typed_config(cfg)
    run_cfg = run()
    assert run_cfg.model.name == "CodeLlama-34b-Instruct-hf" and run_cfg.model.num_hidden_layers == 48
    assert run_cfg.model.num_key_value_heads == 8 and run_cfg.model.source == "shape_only"
    assert run("model.num_hidden_layers=2").model.num_hidden_layers == 2
    with pytest.raises(ConfigError, match="model.config"):
        cfg = compose(["dataplane=sim", "model=hf"])
        from omegaconf import open_dict
        with open_dict(cfg):
            del cfg["hydra"]
        typed_config(cfg)


@pytest.mark.timeout(30)
def test_a_config_the_simulator_cannot_price_is_refused_naming_file_and_key(tmp_path):
    with pytest.raises(HfConfigError, match="no such file"):
        model_from_hf_config(tmp_path / "missing.json")
    with pytest.raises(HfConfigError, match="model_type 'mamba' is not one the simulator prices"):
        model_from_hf_config(write(tmp_path, {"model_type": "mamba", "hidden_size": 8}))
    broken = {k: v for k, v in LLAMA2_7B.items() if k != "num_hidden_layers"}
    with pytest.raises(HfConfigError, match=r"config.json: no 'num_hidden_layers'"):
        model_from_hf_config(write(tmp_path, broken))
    with pytest.raises(HfConfigError, match="'hidden_size'='wide' is not a number"):
        model_from_hf_config(write(tmp_path, {**LLAMA2_7B, "hidden_size": "wide"}))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(HfConfigError, match="not a JSON file"):
        model_from_hf_config(tmp_path / "bad.json")
    assert {f.name for f in fields(ModelConfig)} >= set(SHAPE)
