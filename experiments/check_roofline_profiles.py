"""How far the default roofline is from every measured GPU profile in Vidur's format.

For every <gpu>/<org>/<model>/mlp.csv under a Vidur profiling root (TP 1 rows), the model is
built from the profile's shape columns and the hardware from configs/hardware/<gpu>.yaml
(`step_overhead` 0: the profile is kernel time only), and the roofline's dense time
(`Roofline.dense_time`: all layers' GEMMs and elementwise ops + the embedding, no attention, no
LM head) is compared with the profile's: layers x Σ per-op medians (the residual add twice in a
Llama-style block, once in phi-2's parallel one) + the embedding, at every profiled num_tokens.
The layer count is the model's real one (vidur_profiles.LAYERS); it scales both sides alike,
so the errors are those of one layer up to the embedding's small share.

Printed (Markdown): the worst |error| over decode-shaped steps (num_tokens 1-4,096, powers of
two), over prefill chunks (512-16,384, powers of two, as far as the profile goes), and the
median over all profiled num_tokens. Where a profile directory also has Vidur's attention.csv,
the roofline's attention (one layer) is compared with its rows: a decode row is `batch_size`
requests each with `kv_cache_size` tokens cached; a prefill row one chunk of
`prefill_chunk_size` tokens after `kv_cache_size` cached ones; measured = attn_decode or
attn_prefill + attn_kv_cache_save (the KV write, where the file times it), as Vidur adds them.

    python experiments/check_roofline_profiles.py /tmp/vidur_profiles [--gpus a100 h100 a40]
        [--hardware flops_efficiency=0.68 bw_efficiency=0.68 kernel_latency=0]   # what-if, every GPU
        [--cost-model kernel]                                                     # the kernel cost model
        [--serving-engine none]       # current libraries' kernels (default vidur: the library Vidur profiled with)
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from vidur_profiles import PROFILE_ENGINE, cases, override_hardware, set_engine
from policylab.dataplane.profile import LAYER_OPS, PARALLEL_LAYER_OPS
from policylab.dataplane.profile_csv import floats, read_table
from policylab.dataplane.kernel_model import KernelCostModel
from policylab.dataplane.roofline import Roofline

from policylab.dataplane.shaped import ShapedCostModel

COST_MODEL = {"roofline": Roofline, "kernel": KernelCostModel, "shaped": ShapedCostModel}
Model = Roofline

DECODE = [2 ** i for i in range(13)]                 # 1 .. 4,096
PREFILL = [2 ** i for i in range(9, 15)]             # 512 .. 16,384
SIGNED = DECODE + [8192, 16384]


def measured_dense(case) -> dict:
    """num_tokens -> the profile's dense time (s), duplicates averaged."""
    ops = LAYER_OPS if "time_stats.post_attention_layernorm.median" in case.table else PARALLEL_LAYER_OPS
    per_layer = sum(case.column(f"time_stats.{op}.median") for op in ops)
    t = (case.model.num_hidden_layers * per_layer + case.column("time_stats.emb.median")) / 1e3
    n = case.column("num_tokens").astype(int)
    sums, counts = {}, {}
    for x, y in zip(n, t):
        sums[x], counts[x] = sums.get(x, 0.0) + y, counts.get(x, 0) + 1
    return {x: sums[x] / counts[x] for x in sums}


def dense_errors(case) -> dict:
    roofline, truth = Model(case.model, case.hardware, 1, 1, case.engine), measured_dense(case)
    err = {n: roofline.dense_time(int(n)) / t - 1 for n, t in sorted(truth.items())}
    decode = [abs(err[n]) for n in DECODE if n in err]
    prefill = [abs(err[n]) for n in PREFILL if n in err]
    return {"decode": max(decode), "decode_at": max((n for n in DECODE if n in err), key=lambda n: abs(err[n])),
            "prefill": max(prefill), "prefill_at": max((n for n in PREFILL if n in err), key=lambda n: abs(err[n])),
            "prefill_to": max(n for n in PREFILL if n in err), "median": float(np.median(np.abs(list(err.values())))),
            "points": len(err), "signed": {n: err[n] for n in DECODE + PREFILL if n in err}}


def attention_rows(path: Path) -> dict:
    """TP-1 rows of a Vidur attention.csv: phase -> (batch, chunk, cached, kernel s, KV-write s)."""
    t = read_table(path, ["batch_size", "prefill_chunk_size", "kv_cache_size", "num_tensor_parallel_workers",
                          "time_stats.attn_prefill.median", "time_stats.attn_decode.median"])
    tp1 = floats(t, "num_tensor_parallel_workers", path) == 1
    chunk = floats(t, "prefill_chunk_size", path)
    out = {}
    for phase, rows in (("decode", tp1 & (chunk == 0)), ("prefill", tp1 & (chunk > 0))):
        kernel = floats(t, f"time_stats.attn_{phase}.median", path, rows) / 1e3
        save = (floats(t, "time_stats.attn_kv_cache_save.median", path, rows) / 1e3
                if "time_stats.attn_kv_cache_save.median" in t else np.zeros(len(kernel)))
        out[phase] = (floats(t, "batch_size", path, rows), floats(t, "prefill_chunk_size", path, rows),
                      floats(t, "kv_cache_size", path, rows), kernel, save)
    return out


def attention_errors(case) -> dict:
    """phase -> (rows, median and worst error vs kernel + KV write, median error vs the kernel alone)."""
    roofline, layers = Model(case.model, case.hardware, 1, 1, case.engine), case.model.num_hidden_layers
    out = {}
    for phase, (batch, chunk, cached, kernel, save) in attention_rows(case.directory / "attention.csv").items():
        if not len(kernel):
            continue
        if phase == "decode":
            model = [roofline.attention_time([1] * int(b), [int(k)] * int(b), int(b)) / layers
                     for b, k in zip(batch, cached)]
        else:
            model = [roofline.attention_time([int(c)], [int(k)], int(c)) / layers for c, k in zip(chunk, cached)]
        err, err_kernel = np.array(model) / (kernel + save) - 1, np.array(model) / kernel - 1
        out[phase] = (len(err), float(np.median(err)), float(err[np.argmax(np.abs(err))]), float(np.median(err_kernel)),
                      bool(save.any()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", type=Path, help="Vidur's data/profiling (or its compute/ folder)")
    ap.add_argument("--gpus", nargs="*", help="only these GPUs (default: every one with configs/hardware/<gpu>.yaml)")
    ap.add_argument("--hardware", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="override hardware fields on every GPU (e.g. to compare with other efficiencies)")
    ap.add_argument("--cost-model", choices=sorted(COST_MODEL), default="roofline",
                    help="shaped (the simulator's default), roofline or kernel (dataplane.cost_model=...)")
    ap.add_argument("--serving-engine", default=PROFILE_ENGINE,
                    help="configs/serving_engine/ preset the profiled kernels are priced in (default: vidur)")
    args = ap.parse_args()
    global Model
    Model = COST_MODEL[args.cost_model]
    found = cases(args.root, args.gpus)
    override_hardware(found, args.hardware)
    set_engine(found, args.serving_engine)
    print("Dense step (all layers + embedding), roofline vs profile, step_overhead 0:\n")
    print("| GPU | model | decode 1-4,096: worst | prefill 512-16,384: worst | median, all points |")
    print("|---|---|---|---|---|")
    signed = {}
    for case in found:
        e = dense_errors(case)
        signed[(case.gpu, case.name)] = e["signed"]
        hw = case.hardware
        print(f"| {case.gpu} ({hw.flops_efficiency:.2f} / {hw.bw_efficiency:.2f} / {hw.kernel_latency * 1e6:.1f} us) "
              f"| {case.name} | {e['decode'] * 100:.1f} % (at {e['decode_at']}) "
              f"| {e['prefill'] * 100:.1f} % (at {e['prefill_at']}; profiled to {e['prefill_to']:,}) "
              f"| {e['median'] * 100:.1f} % ({e['points']}) |")
    print("\nSigned error (%) at each power of two:\n")
    print("| GPU / model | " + " | ".join(f"{n:,}" for n in SIGNED) + " |")
    print("|---|" + "---|" * len(SIGNED))
    for (gpu, name), err in signed.items():
        print(f"| {gpu} {name} | " + " | ".join(f"{err[n] * 100:+.0f}" if n in err else "" for n in SIGNED) + " |")
    with_attention = [c for c in found if (c.directory / "attention.csv").is_file()]
    if with_attention:
        print("\nAttention (one layer), roofline vs attention.csv rows at TP 1 (measured = kernel + KV write):\n")
        print("| GPU | model | phase | rows | median error | worst error | median error vs the kernel alone |")
        print("|---|---|---|---|---|---|---|")
        for case in with_attention:
            for phase, (rows, median, worst, median_kernel, has_save) in attention_errors(case).items():
                alone = f"{median_kernel * 100:+.0f} %" if has_save else "(no KV-write column)"
                print(f"| {case.gpu} | {case.name} | {phase} | {rows} | {median * 100:+.0f} % | {worst * 100:+.0f} % "
                      f"| {alone} |")


if __name__ == "__main__":
    main()
