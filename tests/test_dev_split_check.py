"""experiments/check_vllm_e2e.py's reading of a file in the development split's format (the real vLLM
H100 runs' table): models and GPUs by name or by mapping, cells checked with the file, line and column,
stages whose every request failed kept and shown without latencies."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from policylab.traces.errors import TraceError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import check_vllm_e2e  # noqa: E402


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
    path = _split(tmp_path, [_row("meta-llama/Llama-2-70b-chat-hf", "NVIDIA H100 80GB HBM3"), _row("My-Llama-13B")])
    with pytest.raises(TraceError, match=r"split.csv:3: column 'model': 'My-Llama-13B' names no configs/model "
                                         r"preset; map it: --model 'My-Llama-13B=PRESET'"):
        check_vllm_e2e.benchmarks(path, 10.0)
    runs = {b.name: b for b in check_vllm_e2e.benchmarks(path, 10.0, {"My-Llama-13B": "llama2-13b"})}
    big, mine = runs["meta-llama/Llama-2-70b-chat-hf TP1 codegen"], runs["My-Llama-13B TP1 codegen"]
    assert (big.model, big.gpu, big.model_config) == ("llama2-70b", "h100", None)
    assert (mine.model, mine.gpu) == ("llama2-13b", "h100")
    config = tmp_path / "config.json"
    config.write_text("{}")
    mine = check_vllm_e2e.benchmarks(path, 10.0, {"My-Llama-13B": str(config)})[1]
    assert (mine.model, mine.model_config) == ("hf", str(config))
    with pytest.raises(TraceError, match="a100.csv:2: column 'gpu': 'A100-40GB': the a100 preset has 80 GB"):
        check_vllm_e2e.benchmarks(_split(tmp_path, [_row("Llama-2-7B", "A100-40GB")], "a100.csv"), 10.0)
    with pytest.raises(SystemExit, match=r"--model My-Llama-13B=llama-13b: no configs/model preset 'llama-13b'; "
                                         r"one of"):
        check_vllm_e2e.benchmarks(path, 10.0, {"My-Llama-13B": "llama-13b"})
    with pytest.raises(SystemExit, match=r"no such config.json"):
        check_vllm_e2e.benchmarks(path, 10.0, {"My-Llama-13B": str(tmp_path / "missing.json")})


@pytest.mark.timeout(60)
@pytest.mark.parametrize("column, value, message", [
    ("rate_req_s", "fast", ":2: column 'rate_req_s': expected a number > 0 and at most 1e\\+09, got \"fast\""),
    ("max_num_seqs", "12.5", ":2: column 'max_num_seqs': expected an integer from 1 to 1,048,576, got \"12.5\""),
    ("gpu_memory_utilization", "90", ":2: column 'gpu_memory_utilization': expected a number > 0 and at most 1,"),
    ("ttft_mean_s", "-1", ":2: column 'ttft_mean_s': expected a number from 0 s to 1e\\+09 s"),
    ("prefix_caching", "yes", ":2: column 'prefix_caching': expected True or False, got \"yes\""),
    ("output_len", None, ":1: column 'output_len': missing from the header"),
])
def test_a_cell_that_is_not_what_its_column_holds_stops_the_check_at_its_line(tmp_path, column, value, message):
    row = _row("Llama-2-7B")
    if value is None:
        row.pop(column)
    else:
        row[column] = value
    with pytest.raises(TraceError, match=message):
        check_vllm_e2e.benchmarks(_split(tmp_path, [row]), 10.0)


@pytest.mark.timeout(300)
def test_a_stage_whose_every_request_failed_is_replayed_and_shown_without_latencies(tmp_path, capsys):
    """Its measured latencies are empty cells: the stage is still replayed (it loads the server for the
    next), counted as overloaded, and printed with dashes, not NaN, and not in the normal-load MAPE."""
    light = _row("Llama-2-7B") | {"rate_req_s": 2.0, "duration_s": 10, "requests_ok": 20}
    lost = _row("Llama-2-7B") | {"stage": 1, "rate_req_s": 2.0, "duration_s": 10, "requests_ok": 0,
                                 "requests_failed": 20, "ttft_mean_s": "", "e2e_mean_s": "",
                                 "per_token_interval_mean_s": ""}
    path = _split(tmp_path, [light, lost])
    measured = check_vllm_e2e.benchmarks(path, None)[0].stages[1]
    assert measured.requests_failed == 20 and measured.ttft_mean != measured.ttft_mean    # NaN
    assert check_vllm_e2e.main([str(path)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| Llama-2-7B TP1 codegen | 1 |"))
    assert "nan" not in row and "| - / " in row and row.count("| - |") == 3
    assert "MAPE over 1 stages" in out
