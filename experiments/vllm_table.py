"""Where policylab's shipped policies and vLLM 0.32's own scheduler part ways, on one burst.

12 requests at t=0 (prompts 60..390 tokens, outputs 8..52), max_num_seqs 8, block size 32,
prefix caching off; 128 KV blocks (ample) or 21 (requests are preempted). Each row replays a
policylab policy and vLLM's real v1 Scheduler (bare, `policylab.testing.vllm_conformance`) and
prints steps, preemptions and the first step where they differ; the last column replays
`vllm_v1` with the same vLLM settings.

Needs vLLM: VLLM_ENABLE_V1_MULTIPROCESSING=0 .venv-vllm/bin/python experiments/vllm_table.py
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policies.chunked import Chunked                       # noqa: E402
from policies.decode_first import DecodeFirst              # noqa: E402
from policies.prefill_first import PrefillFirst            # noqa: E402
from policylab.testing.vllm_conformance import VllmRequest, VllmScenario, compare   # noqa: E402


def burst(num_blocks: int, budget: int, **knobs) -> VllmScenario:
    requests = tuple(VllmRequest(0, tuple(1000 * (i + 1) + k for k in range(60 + 30 * i)), 8 + 4 * i)
                     for i in range(12))
    return VllmScenario(requests=requests, num_blocks=num_blocks, max_num_batched_tokens=budget, max_model_len=512,
                        **knobs)


ROWS = [   # (label, policylab policy, its label, vLLM settings label, scenario)
    ("chunked, budget 256, 128 blocks", lambda: Chunked(chunk_size=None), "chunked (no chunk cap, 1 partial prefill)",
     "default", burst(128, 256)),
    ("same, 21 blocks", lambda: Chunked(chunk_size=None), "chunked", "default", burst(21, 256)),
    ("same, 21 blocks", lambda: Chunked(chunk_size=None), "chunked", "scheduler_reserve_full_isl=False",
     burst(21, 256, scheduler_reserve_full_isl=False)),
    ("no chunking, budget 1024, 128 blocks", lambda: DecodeFirst(admit_into_free_slots=True),
     "decode_first admit_into_free_slots=true", "chunked prefill off", burst(128, 1024, enable_chunked_prefill=False)),
    ("same, 21 blocks", lambda: DecodeFirst(admit_into_free_slots=True), "decode_first admit_into_free_slots=true",
     "chunked prefill off", burst(21, 1024, enable_chunked_prefill=False)),
    ("no chunking, budget 1024, 128 blocks", lambda: PrefillFirst(watermark=0.0), "prefill_first watermark=0",
     "chunked prefill off", burst(128, 1024, enable_chunked_prefill=False)),
    ("same, 21 blocks", lambda: PrefillFirst(watermark=0.0), "prefill_first watermark=0", "chunked prefill off",
     burst(21, 1024, enable_chunked_prefill=False)),
]


def main() -> None:
    logging.disable(logging.WARNING)
    print("| scenario | policylab | vLLM 0.32 | steps | preemptions | first divergence | vllm_v1 |")
    print("|---|---|---|---|---|---|---|")
    for label, policy, name, settings, scenario in ROWS:
        c = compare(scenario, policy())
        ours = compare(scenario)
        first = "none" if c.divergence is None else f"step {c.divergence.step}"
        same = "identical" if ours.divergence is None else f"differs at step {ours.divergence.step}"
        print(f"| {label} | `{name}` | {settings} | {c.steps[0]} / {c.steps[1]} | "
              f"{c.preemptions[0]} / {c.preemptions[1]} | {first} | {same} ({ours.steps[0]} steps) |")


if __name__ == "__main__":
    main()
