"""Each cost term of the three cost models against public kernel timings: MAPE, bias, worst.

GEMMs: every GEMM of Vidur's mlp.csv profiles (attn_pre_proj = QKV, attn_post_proj = O,
mlp_up_proj, mlp_down_proj; TP-1 rows, medians, duplicates averaged) under a Vidur profiling
root given on the command line (github.com/microsoft/vidur's data/profiling; without it, the
shipped A100 Llama-3-8B sample in tests/data/vidur), against the model's `gemm_time` plus one
`kernel_latency`, grouped by token count m.

Elementwise kernels: each profile's norms, RoPE, activation and residual adds of one layer
(Vidur's op medians; the add twice in a Llama-style block) against the model's elementwise time
plus its elementwise launches, grouped by token count m.

Attention: one layer's attention kernel against
- Vidur's A100 Llama-3-8B attention.csv rows in tests/data/vidur/attention_points.csv (FlashInfer;
  the kernel alone, attn_prefill or attn_decode medians; decodes of 1-512 requests at 96-1,408
  cached tokens, TP 1 and 4; prefill chunks of 64-14,336 tokens after 0-5,440 cached);
- vLLM PR #43232's FLASH_ATTN decode table (B200: check_attention_kernels.py),
grouped by phase and work (decode: requests x context; prefill: chunk length). The kernel and
shaped models' cache-write launch is left out (the rows time the attention kernel alone).

    python experiments/check_cost_terms.py [VIDUR_PROFILING_ROOT] [--hardware FIELD=VALUE ...]
        [--serving-engine none]

The profiles' GEMMs, elementwise kernels and attention rows are priced in `serving_engine=vidur`
(kernel time on the library Vidur profiled with: the H100's GEMMs in waves, no persistent kernels,
FlashInfer's decode planner); the B200 rows in the default `none`;
`--serving-engine none` prices them as a current library runs them (persistent H100 GEMMs from
one full wave up, split-KV decodes; docs/fidelity.md and docs/cost-model.md give both errors).
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from check_attention_kernels import VLLM_43232_FLASH_ATTN_DECODE
from vidur_profiles import ELEMENTWISE, PROFILE_ENGINE, ROOT, cases, engine, hardware, override_hardware, set_engine
from policylab.apps.sim_check import load_group
from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.kernel_model import KernelCostModel
from policylab.dataplane.roofline import Roofline
from policylab.dataplane.shaped import ShapedCostModel

MODELS = {"roofline": Roofline, "kernel": KernelCostModel, "shaped": ShapedCostModel}
SAMPLE = ROOT / "tests" / "data" / "vidur"
M_RANGES = ((1, 16), (17, 128), (129, 511), (512, 2048), (2049, 1 << 20))
POINTS = SAMPLE / "attention_points.csv"


def stats(err) -> tuple:
    """(points, MAPE, bias, worst signed error) of relative errors."""
    e = np.asarray(err, dtype=float)
    return len(e), float(np.mean(np.abs(e))), float(np.mean(e)), float(e[np.argmax(np.abs(e))])


def gemm_errors(root: Path, overrides=(), engine: str = PROFILE_ENGINE) -> dict:
    """(cost model, GPU, m range) -> relative errors of every profiled GEMM."""
    out: dict = {}
    found = cases(root)
    override_hardware(found, overrides)
    set_engine(found, engine)
    for case in found:
        n = case.column("num_tokens").astype(int)
        built = {name: cls(case.model, case.hardware, 1, 1, case.engine) for name, cls in MODELS.items()}
        for op, (k, m) in case.gemm_shapes().items():
            times: dict = {}
            for x, t in zip(n, case.column(f"time_stats.{op}.median") / 1e3):
                times.setdefault(int(x), []).append(t)
            for x, ts in times.items():
                lo = next(r for r in M_RANGES if r[0] <= x <= r[1])
                for name, cm in built.items():
                    err = (cm.gemm_time(x, k, m) + cm.latency) / float(np.mean(ts)) - 1
                    out.setdefault((name, case.gpu, lo), []).append(err)
    return out


def elementwise_errors(root: Path, engine: str = PROFILE_ENGINE) -> dict:
    """(cost model, GPU, m range) -> relative errors of one layer's elementwise kernels."""
    out: dict = {}
    found = cases(root)
    set_engine(found, engine)
    for case in found:
        n = case.column("num_tokens").astype(int)
        llama_block = "time_stats.post_attention_layernorm.median" in case.table
        measured = sum(case.column(f"time_stats.{op}.median") * (2 if op == "add" and llama_block else 1)
                       for op in ELEMENTWISE if f"time_stats.{op}.median" in case.table) / 1e3
        for name, cls in MODELS.items():
            cm = cls(case.model, case.hardware, 1, 1, case.engine)
            s = cm.shape
            launch = cm.elementwise_latency if isinstance(cm, ShapedCostModel) else cm.latency
            for x, t in zip(n, measured):
                lo = next(r for r in M_RANGES if r[0] <= x <= r[1])
                t_model = cm.elementwise_time(int(x), s.elementwise_elems) + s.elementwise_kernels * launch
                out.setdefault((name, case.gpu, lo), []).append(t_model / t - 1)
    return out


def decode_work(batch: int, context: int) -> str:
    work = batch * context
    return "<= 4k" if work <= 4096 else "4k-64k" if work <= 65536 else "64k-1M" if work <= 1 << 20 else "> 1M"


def attention_errors(engine_name: str = PROFILE_ENGINE) -> dict:
    """(cost model, source, phase, work) -> relative errors of one layer's attention kernel (the Vidur
    rows priced in `engine_name`)."""
    out: dict = {}
    model, a100, profiled = load_group("model", "llama3-8b", ModelConfig), hardware("a100"), engine(engine_name)
    built = {(name, tp): cls(model, a100, tp, 1, profiled) for name, cls in MODELS.items() for tp in (1, 4)}
    with POINTS.open() as f:
        for row in csv.DictReader(f):
            tp, b, c, k = (int(row[x]) for x in ("tp", "batch_size", "prefill_chunk_size", "kv_cache_size"))
            measured = float(row["attn_ms"]) / 1e3
            for name in MODELS:
                cm = built[name, tp]
                t = cm.attention_time([c], [k], c) if c else cm.attention_time([1] * b, [k] * b, b)
                t = t / model.num_hidden_layers - (0 if name == "roofline" else cm.latency)
                key = (name, "Vidur A100", "prefill" if c else "decode",
                       f"chunk {'<= 256' if c <= 256 else '257-4k' if c <= 4096 else '> 4k'}" if c else decode_work(b, k))
                out.setdefault(key, []).append(t / measured - 1)
    b200 = load_group("hardware", "b200", HardwareConfig)
    for name, cls in MODELS.items():
        cm = cls(model, b200)
        for (b, kt), us in VLLM_43232_FLASH_ATTN_DECODE.items():
            t = cm.attention_time([1] * b, [kt * 1024] * b, b) / model.num_hidden_layers
            t -= 0 if name == "roofline" else cm.latency
            out.setdefault((name, "vLLM #43232 B200", "decode", decode_work(b, kt * 1024)), []).append(t * 1e6 / us - 1)
    return out


def order(label: str) -> tuple:
    """Sort key of a group label: ranges by their lower bound ("<= 4k" first, "> 4k" last), else by name."""
    words = label.replace(",", "").split()
    number = next((w for w in words if w[:1].isdigit()), None)
    if number is None:
        return (1, label, 0)
    low = number.split("-")[0]
    value = float(low.rstrip("kM")) * {"k": 1e3, "M": 1e6}.get(low[-1], 1)
    return (0, " ".join(w for w in words if not w[:1].isdigit() and w not in ("<=", ">", ">=")),
            value + (0.5 if (">" in words or ">=" in words) else 0) - (0.5 if "<=" in words else 0))


def table(groups: dict, key_names: tuple) -> str:
    head = "| " + " | ".join(key_names) + " | points | " + " | ".join(
        f"{m} MAPE / bias / worst" for m in MODELS) + " |"
    lines = [head, "|" + "---|" * (len(key_names) + 1 + len(MODELS))]
    keys = sorted({k[1:] for k in groups}, key=lambda key: [order(x) for x in key])
    for key in keys:
        cells = [stats(groups[(m, *key)]) for m in MODELS]
        lines.append("| " + " | ".join(str(x) for x in key) + f" | {cells[0][0]} | " + " | ".join(
            f"{mape * 100:.1f} % / {bias * 100:+.1f} % / {worst * 100:+.0f} %" for _, mape, bias, worst in cells) + " |")
    return "\n".join(lines)


def overall(groups: dict) -> str:
    lines = ["| cost model | points | MAPE | bias | worst |", "|---|---|---|---|---|"]
    for m in MODELS:
        pts, mape, bias, worst = stats([e for k, v in groups.items() if k[0] == m for e in v])
        lines.append(f"| {m} | {pts} | {mape * 100:.1f} % | {bias * 100:+.1f} % | {worst * 100:+.0f} % |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", nargs="?", type=Path, default=SAMPLE, help="Vidur's data/profiling")
    ap.add_argument("--hardware", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="override hardware fields of every profiled GPU's GEMMs (null: unset)")
    ap.add_argument("--serving-engine", default=PROFILE_ENGINE,
                    help="configs/serving_engine/ preset the profiled kernels are priced in (default: vidur)")
    args = ap.parse_args()
    root = args.root
    gemms = gemm_errors(root, args.hardware, args.serving_engine)
    gemms = {(m, gpu, f"{lo:,}-{hi:,}" if hi < 1 << 20 else f">= {lo:,}"): v for (m, gpu, (lo, hi)), v in gemms.items()}
    print(f"GEMMs ({root}), predicted / measured - 1:\n")
    print(table(gemms, ("GPU", "m")))
    print("\nall GEMMs:\n\n" + overall(gemms))
    elementwise = {(m, gpu, f"{lo:,}-{hi:,}" if hi < 1 << 20 else f">= {lo:,}"): v
                   for (m, gpu, (lo, hi)), v in elementwise_errors(root, args.serving_engine).items()}
    print("\nElementwise kernels (one layer: norms, RoPE, activation, residual adds):\n")
    print(table(elementwise, ("GPU", "m")))
    print("\nall elementwise points:\n\n" + overall(elementwise))
    attention = attention_errors(args.serving_engine)
    print("\nAttention kernels (one layer):\n")
    print(table(attention, ("source", "phase", "work")))
    print("\nall attention kernels:\n\n" + overall(attention))


if __name__ == "__main__":
    main()
