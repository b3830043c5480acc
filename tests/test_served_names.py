"""A served model's name and a GPU's name resolved to the shipped presets (policylab.apps.served_names),
as `fidelity-e2e` and experiments/check_vllm_e2e.py read them from results and benchmark tables."""
from __future__ import annotations

import pytest

from policylab.apps.served_names import gpu_preset, model_preset


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, preset", [
    ("Llama-2-7B", "llama2-7b"),                                   # the development split's names
    ("Mixtral-8x7B-v0.1", "mixtral-8x7b"),
    ("CodeLlama-34B-Instruct", "codellama-34b"),
    ("meta-llama/Llama-2-70b-chat-hf", "llama2-70b"),              # Hugging Face ids
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
    ("01-ai/Yi-34B-Chat", "yi-34b"),
    ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),                    # V3 is the model, not a version tag
    ("meta-llama/Llama-3.1-8B-Instruct", "llama3-8b"),             # an alias: Llama 3's layers
    ("Meta-Llama-3-8B", "llama3-8b"),
    ("/models/Llama-2-13b-hf/", "llama2-13b"),                     # a local checkpoint directory
    ("TheBloke/Llama-2-70B-AWQ", None),                            # quantized weights: not the BF16 preset
    ("Llama-2-7B-GPTQ", None),
    ("gpt-4", None),
    ("tiny", None),                                                # presets no server serves
    ("hf", None),
])
def test_a_served_models_name_means_the_preset_it_spells_and_no_other(name, preset):
    assert model_preset(name) == preset


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, preset", [
    ("H100-80GB", "h100"), ("NVIDIA H100 80GB HBM3", "h100"), ("h100", "h100"), ("A100-SXM4-80GB", "a100"),
    ("H200", "h200"), ("NVIDIA H200 141GB", "h200"), ("L40S", "l40s"), ("B200", "b200"), ("MI300X", "mi300x"),
])
def test_a_gpus_name_means_its_preset(name, preset):
    assert gpu_preset(name) == preset


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, message", [
    ("A100-40GB", "the a100 preset has 80 GB, not 40 GB: set hardware.mem_bytes"),
    ("H100 PCIe", "the h100 preset is the SXM part; its PCIE version"),
    ("H100 NVL 94GB", "its NVL version"),
    ("RTX 4090", "no preset in its name; one of a100,"),
    ("L40", "no preset in its name"),
])
def test_a_gpu_that_is_not_its_presets_part_is_refused_with_the_fix(name, message):
    with pytest.raises(ValueError, match=message):
        gpu_preset(name)
