"""Tensor-parallel shards against Vidur's measured per-GPU kernel times at TP 2, 4 and 8.

Vidur's mlp.csv also times each op of one block on one GPU of a TP group
(`num_tensor_parallel_workers` = 2, 4, 8: the shard's GEMMs and elementwise ops, no
communication). Both cost models are built with `tp` and their dense time without the
all-reduces (`dense_time(n) - (2 x layers + 1) x all_reduce(n x hidden x 2)`) is compared with
layers x Σ op medians + the embedding, at the powers of two the profile has.

    python experiments/check_tensor_parallel_profiles.py DIR [--cost-model kernel]   # DIR: Vidur's data/profiling
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from vidur_profiles import cases, override_hardware
from policylab.dataplane.kernel_model import KernelCostModel
from policylab.dataplane.profile import LAYER_OPS
from policylab.dataplane.roofline import Roofline

MODELS = {"roofline": Roofline, "kernel": KernelCostModel}
POWERS = [2 ** i for i in range(15)]


def shard_errors(case, tp: int, cls) -> list:
    t = pd.read_csv(case.directory / "mlp.csv")
    t = t[t.num_tensor_parallel_workers == tp]
    if t.empty or case.model.num_attention_heads % tp:
        return []
    layers = case.model.num_hidden_layers
    t = t.assign(dense=(layers * sum(t[f"time_stats.{op}.median"] for op in LAYER_OPS) + t["time_stats.emb.median"]) / 1e3)
    measured = t.groupby("num_tokens")["dense"].mean()
    cost = cls(case.model, case.hardware, tp, 1, case.engine)
    act = case.model.hidden_size * 2
    out = []
    for n in POWERS:
        if n in measured.index:
            shard = cost.dense_time(n) - (2 * layers + 1) * cost.link.all_reduce(n * act)
            out.append(shard / measured[n] - 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--cost-model", choices=sorted(MODELS), default="roofline")
    ap.add_argument("--hardware", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="override hardware fields on every GPU (null: unset)")
    args = ap.parse_args()
    cls = MODELS[args.cost_model]
    found = [c for c in cases(args.root) if c.model.architecture != "phi"]
    override_hardware(found, args.hardware)
    print(f"Per-GPU shard, {args.cost_model} vs Vidur's TP rows (worst |error| / median |error| at powers of two):\n")
    print("| GPU | model | TP 2 | TP 4 | TP 8 |\n|---|---|---|---|---|")
    every = []
    for case in found:
        cells = []
        for tp in (2, 4, 8):
            err = np.abs(shard_errors(case, tp, cls))
            every += list(err)
            cells.append(f"{err.max() * 100:.1f} / {np.median(err) * 100:.1f} %" if len(err) else "")
        print(f"| {case.gpu} | {case.name} | " + " | ".join(cells) + " |")
    print(f"\nall {len(every)} points: median {np.median(every) * 100:.1f} %, worst {np.max(every) * 100:.1f} %")


if __name__ == "__main__":
    main()
