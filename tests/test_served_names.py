"""A served model's name and a GPU's name resolved to the shipped presets (policylab.apps.served_names),
as `fidelity-e2e` and experiments/check_vllm_e2e.py read them from results and benchmark tables."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from policylab.apps.served_names import gpu_preset, model_preset

ROOT = Path(__file__).resolve().parents[1]


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


def _row(model: str, gpu: str = "H100-80GB") -> dict:
    return {"model": model, "gpu": gpu, "tensor_parallel": 1, "max_num_seqs": 128, "max_num_batched_tokens": 2048,
            "max_model_len": 4096, "block_size": 16, "gpu_memory_utilization": 0.9, "prefix_caching": "True",
            "workload": "codegen", "num_groups": 10, "prompts_per_group": 10, "system_prompt_len": 100,
            "question_len": 466, "output_len": 247, "stage": 0, "rate_req_s": 5.0, "duration_s": 600,
            "requests_ok": 3000, "requests_failed": 0, "prompt_len_median": 591, "ttft_mean_s": 0.03,
            "e2e_mean_s": 2.0, "per_token_interval_mean_s": 0.008}


def _split(tmp_path: Path, rows: list, name: str = "split.csv") -> Path:
    path = tmp_path / name
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.mark.timeout(120)
def test_the_development_split_check_reads_models_and_gpus_by_name_or_by_mapping(tmp_path):
    """experiments/check_vllm_e2e.py builds each run with the presets its rows' names spell; a name that
    spells none stops it before any replay with the file, line and the flag that maps it, and
    --model NAME=PRESET maps it (or NAME=config.json, as model=hf)."""
    sys.path.insert(0, str(ROOT / "experiments"))
    import check_vllm_e2e
    path = _split(tmp_path, [_row("meta-llama/Llama-2-70b-chat-hf", "NVIDIA H100 80GB HBM3"), _row("My-Llama-13B")])
    with pytest.raises(SystemExit, match=r"split.csv, line 3, model: 'My-Llama-13B' names no configs/model preset; "
                                         r"map it: --model 'My-Llama-13B=PRESET'"):
        check_vllm_e2e.benchmarks(path, 10.0)
    runs = {b.name: b for b in check_vllm_e2e.benchmarks(path, 10.0, {"My-Llama-13B": "llama2-13b"})}
    big, mine = runs["meta-llama/Llama-2-70b-chat-hf TP1 codegen"], runs["My-Llama-13B TP1 codegen"]
    assert (big.model, big.gpu, big.model_config) == ("llama2-70b", "h100", None)
    assert (mine.model, mine.gpu) == ("llama2-13b", "h100")
    config = tmp_path / "config.json"
    config.write_text("{}")
    mine = check_vllm_e2e.benchmarks(path, 10.0, {"My-Llama-13B": str(config)})[1]
    assert (mine.model, mine.model_config) == ("hf", str(config))
    with pytest.raises(SystemExit, match="line 2, gpu: 'A100-40GB': the a100 preset has 80 GB"):
        check_vllm_e2e.benchmarks(_split(tmp_path, [_row("Llama-2-7B", "A100-40GB")], "a100.csv"), 10.0)
    with pytest.raises(SystemExit, match=r"no such config.json"):
        check_vllm_e2e.benchmarks(path, 10.0, {"My-Llama-13B": str(tmp_path / "missing.json")})
