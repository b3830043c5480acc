"""Output throughput and energy per token of each precision against BF16 on the sim, all requests sent
at once with max_num_seqs = batch (as the ML.ENERGY benchmark and vLLM's throughput benchmark run),
Llama-3-8B, in the `vllm` serving engine, 390-token outputs and 250-token prompts on average
(experiments/check_energy_mlenergy.py's workload). A precision a GPU cannot run is shown as refused.

    python experiments/precision_check.py [--gpus h100 a100] [--batches 16 64 256]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from check_energy_mlenergy import serving_engine, workload  # noqa: E402
from policies.chunked import Chunked  # noqa: E402
from policylab.apps.sim_check import load_group  # noqa: E402
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig  # noqa: E402
from policylab.core.engine import Engine  # noqa: E402
from policylab.dataplane.config import DataplaneConfig  # noqa: E402
from policylab.dataplane.sim import SimDataPlane  # noqa: E402

PRECISIONS = {"bf16": {}, "quant=fp8": dict(weight_dtype="fp8", compute_dtype="fp8"),
              "quant=int8": dict(weight_dtype="int8", compute_dtype="int8"), "quant=w8a16": dict(weight_dtype="int8"),
              "quant=w4a16": dict(weight_dtype="int4"), "kv_dtype=fp8": dict(kv_cache_dtype="fp8"),
              "quant=fp8 kv_dtype=fp8": dict(weight_dtype="fp8", compute_dtype="fp8", kv_cache_dtype="fp8")}


def measure(model, hw, batch: int, keys: dict):
    """(output tokens/s, J per output token) of the replay, or None where the GPU refuses the precision."""
    try:
        plane = SimDataPlane(model, hw, DataplaneConfig(kind="sim", serving_engine=serving_engine("vllm"), **keys))
    except ValueError:
        return None
    trace = workload(batch, 390, 250)
    result = Engine(trace, Chunked(chunk_size=8192), plane, EngineConfig(max_num_seqs=batch, max_num_batched_tokens=8192,
                                                                        max_model_len=32768), seed=0).run()
    tokens = sum(t.output_tokens for t in trace)
    return tokens / (result.steps["clock"][-1] + result.steps["duration"][-1]), \
        plane.energy_report()["busy_energy_j"] / tokens


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", nargs="*", default=["h100", "a100"])
    ap.add_argument("--batches", nargs="*", type=int, default=[16, 64, 256])
    args = ap.parse_args(argv)
    model = load_group("model", "llama3-8b", ModelConfig)
    print(f"{'GPU':5} {'batch':>5} {'precision':24} {'tok/s':>8} {'x BF16':>7} {'J/token':>8} {'x BF16':>7}")
    for gpu in args.gpus:
        hw = load_group("hardware", gpu, HardwareConfig)
        for batch in args.batches:
            base = measure(model, hw, batch, {})
            for name, keys in PRECISIONS.items():
                got = measure(model, hw, batch, keys) if keys else base
                if got is None:
                    print(f"{gpu:5} {batch:>5} {name:24} refused (no tensor cores of that dtype)")
                    continue
                print(f"{gpu:5} {batch:>5} {name:24} {got[0]:>8.0f} {got[0] / base[0]:>7.2f} {got[1]:>8.4f} "
                      f"{got[1] / base[1]:>7.2f}")


if __name__ == "__main__":
    main()
