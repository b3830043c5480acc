"""The serving-engine presets' terms against the public numbers they come from: error per point.

- vLLM's custom all-reduce timed on H100 without CUDA graphs (sgl-project/sglang PR #2904, the
  "vllm" table: TP 2/4/8, 512 B-1 MiB) against `vllm_eager`'s one-/two-shot form;
- FlashAttention-3's causal forward, head dim 128, H100 SXM5 (Shah et al. 2024, fig. 5: batch x
  length = 16k tokens) against `vllm`'s prefill-attention efficiency;
- vLLM's memory profile (vllm-project/vllm PR #10511: Llama-3-8B on H100, TP 1 and 2) against the KV
  memory `vllm`'s `non_kv_memory` leaves, with the GPU memory CUDA reports there (79.22 GiB);
- vLLM PR #43232's FLASH_ATTN decode table (B200) against the decode kernel with `vllm`'s floor.

    python experiments/check_serving_engine.py
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from check_attention_kernels import VLLM_43232_FLASH_ATTN_DECODE  # noqa: E402
from policylab.apps.sim_check import load_group  # noqa: E402
from policylab.core.config import HardwareConfig, ModelConfig  # noqa: E402
from policylab.dataplane.config import DataplaneConfig  # noqa: E402
from policylab.dataplane.serving_engine import ServingEngine, ServingEngineConfig  # noqa: E402
from policylab.dataplane.shaped import ShapedCostModel  # noqa: E402
from policylab.dataplane.sim import SimDataPlane  # noqa: E402

# sglang PR #2904, "vllm" table (vLLM's custom all-reduce, H100, no CUDA graph): (tp, bytes) -> ms
SGLANG_2904_VLLM = {(2, 512): 0.0095, (2, 4096): 0.0088, (2, 32768): 0.0087, (2, 262144): 0.0129,
                    (2, 524288): 0.0177, (2, 1048576): 0.0266, (4, 512): 0.0091, (4, 4096): 0.0085,
                    (4, 32768): 0.0092, (4, 262144): 0.0206, (4, 524288): 0.0269, (4, 1048576): 0.0402,
                    (8, 512): 0.0101, (8, 4096): 0.0093, (8, 32768): 0.0118, (8, 262144): 0.0241,
                    (8, 524288): 0.0304, (8, 1048576): 0.0450}
EAGER_ALL_REDUCE_BANDWIDTH = 62.7e9     # the eager timing's own slope (bytes read / s), fitted with its latencies
# FlashAttention-3 paper, fig. 5 (causal, head dim 128, H100 SXM5): sequence length -> TFLOP/s
FA3_CAUSAL_HDIM128 = {512: 292, 1024: 423, 2048: 521, 4096: 579, 8192: 602, 16384: 616}
# vLLM PR #10511's memory profile of Meta-Llama-3-8B on H100 (GiB): tp -> (weights, available KV)
VLLM_10511 = {1: (14.96, 53.29), 2: (7.48, None)}
H100_CUDA_TOTAL_GIB = 79.22


def stats(errors: list) -> str:
    e = np.asarray(errors)
    return f"{len(e)} points: MAPE {np.mean(np.abs(e)) * 100:.1f} %, worst {e[np.argmax(np.abs(e))] * 100:+.1f} %"


def main() -> int:
    eager = replace(load_group("serving_engine", "vllm_eager", ServingEngineConfig),
                    custom_all_reduce_bandwidth=EAGER_ALL_REDUCE_BANDWIDTH)
    engine = ServingEngine(eager)
    errs = []
    print("custom all-reduce (vllm_eager's form; sglang PR #2904's timing of vLLM's kernel, H100):")
    for (tp, size), ms in SGLANG_2904_VLLM.items():
        t = engine.custom_all_reduce(tp, size, 0.0)
        errs.append(t / (ms / 1e3) - 1)
        print(f"  TP {tp}, {size:>8} B: {t * 1e6:5.1f} us against {ms * 1e3:5.1f} us ({errs[-1] * 100:+.0f} %)")
    print("  " + stats(errs))

    vllm = load_group("serving_engine", "vllm", ServingEngineConfig)
    errs = []
    print("\nprefill attention (vllm's FlashAttention tiles; FlashAttention-3, causal, head dim 128, H100):")
    for n, tflops in FA3_CAUSAL_HDIM128.items():
        keys = (n + 128) / 2
        model = 989 * vllm.prefill_attention_efficiency * keys / (keys + vllm.prefill_attention_tile_overhead)
        errs.append(model / tflops - 1)
        print(f"  {n:>6} tokens: {model:5.0f} TFLOP/s against {tflops} ({errs[-1] * 100:+.1f} %)")
    print("  " + stats(errs))

    print("\nKV memory (vllm's non_kv_memory; vLLM PR #10511, Llama-3-8B, H100, 0.9 of 79.22 GiB):")
    model, h100 = load_group("model", "llama3-8b", ModelConfig), load_group("hardware", "h100", HardwareConfig)
    assert abs(h100.mem_bytes / 2 ** 30 - H100_CUDA_TOTAL_GIB) < 0.01, "the H100 preset carries CUDA's figure"
    plane = SimDataPlane(model, h100, DataplaneConfig(kind="sim", serving_engine=vllm))
    kv = plane.num_kv_blocks(16) * plane.shape.kv_bytes_per_token_all_gpus() * 16 / 2 ** 30
    weights, measured = VLLM_10511[1]
    print(f"  TP 1: {kv:.2f} GiB of KV against {measured:.2f} ({(kv / measured - 1) * 100:+.1f} %); weights "
          f"{plane.shape.weight_bytes / 2 ** 30:.2f} GiB against {weights:.2f}")

    b200 = load_group("hardware", "b200", HardwareConfig)
    cost = ShapedCostModel(model, b200, 1, 1, ServingEngine(vllm))
    errs = []
    for (b, kt), us in VLLM_43232_FLASH_ATTN_DECODE.items():
        t = cost.attention_time([1] * b, [kt * 1024] * b, b) / model.num_hidden_layers - cost.latency
        errs.append(t * 1e6 / us - 1)
    print(f"\ndecode attention (vllm's 11 us floor; vLLM PR #43232 FLASH_ATTN, B200): {stats(errs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
