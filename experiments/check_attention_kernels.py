"""The attention term of both cost models against published attention-kernel timings.

Data: vLLM PR #43232 ("Xqa decode kernels", github.com/vllm-project/vllm/pull/43232), its table
"Per-cell times (us/layer)", column FLASH_ATTN / FAv3: decode of B requests x S k tokens of
context, per layer. The benchmark's GPU streams up to 5.8 TB/s (beyond an H200: a B200) and its
shape is taken as 32 query / 8 KV heads of 128 in bf16 (Llama-3-8B; assumed from vLLM's
attention-benchmark defaults). Measured = the attention kernel alone, so the kernel model's
cache-write launch is left out of the comparison.

    python experiments/check_attention_kernels.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from policylab.apps.sim_check import load_group  # noqa: E402
from policylab.core.config import HardwareConfig, ModelConfig  # noqa: E402
from policylab.dataplane.kernel_model import KernelCostModel  # noqa: E402
from policylab.dataplane.roofline import Roofline  # noqa: E402
from policylab.dataplane.shaped import ShapedCostModel  # noqa: E402

# (requests, context in k tokens) -> us per layer, FLASH_ATTN (FAv3) column of vLLM PR #43232
VLLM_43232_FLASH_ATTN_DECODE = {
    (1, 1): 11.2, (1, 2): 12.5, (1, 4): 13.8, (1, 8): 17.1, (1, 16): 23.0, (1, 32): 34.5,
    (8, 1): 16.1, (8, 2): 21.1, (8, 4): 32.5, (8, 8): 53.9, (8, 16): 97.2, (8, 32): 183.8,
    (16, 1): 20.1, (16, 2): 31.9, (16, 4): 53.3, (16, 8): 97.3, (16, 16): 183.4,
}


def errors(gpu: str = "b200") -> dict:
    """cost model -> list of predicted / measured - 1 over the table."""
    model, hw = load_group("model", "llama3-8b", ModelConfig), load_group("hardware", gpu, HardwareConfig)
    kernel, roofline, shaped = KernelCostModel(model, hw), Roofline(model, hw), ShapedCostModel(model, hw)
    out = {"shaped": [], "kernel": [], "roofline": []}
    for (b, k), us in VLLM_43232_FLASH_ATTN_DECODE.items():
        ctx = k * 1024
        for name, cm in (("shaped", shaped), ("kernel", kernel)):
            out[name].append((cm.attention_time([1] * b, [ctx] * b, b) / 32 - cm.latency) * 1e6 / us - 1)
        out["roofline"].append(roofline.attention_time([1] * b, [ctx] * b, b) / 32 * 1e6 / us - 1)
    return out


def main() -> None:
    print("| cost model | points | MAPE | bias | worst |\n|---|---|---|---|---|")
    for name, err in errors().items():
        e = np.array(err)
        print(f"| {name} | {len(e)} | {np.mean(np.abs(e)) * 100:.1f} % | {np.mean(e) * 100:+.1f} % "
              f"| {e[np.argmax(np.abs(e))] * 100:+.0f} % |")


if __name__ == "__main__":
    main()
