"""Replays stay identical: every shipped policy on the shipped traces, sim data plane, through
the CLI job, hashes to the digest recorded when the sim's default roofline took a latency per
kernel and the H100's numbers measured over all of Vidur's H100 profiles (#18: 0.68 / 0.90 /
4.8 us; before that, the first refit on one A100 profile: elementwise traffic, embedding gather,
p-norm knee, 0.68 / 0.68, step_overhead 0, `cost_model` in summary.json; before that, the layers
restructure).

A change that moves these on purpose (a new cost model, a policy fix) updates the table here
and says why in its commit. The digest covers every column of requests.parquet and every
summary number (not the config echo, the input's trace_report, or wall-clock fields).
"""
from __future__ import annotations

import hashlib
import json

import pandas as pd
import pytest

from policylab.apps.cli import main

DIGESTS = {
    "prefill_first/bursty": "9f56f0b6a31d550e",
    "decode_first/bursty": "f4a8590d56b394f1",
    "chunked/bursty": "2c0a5e10d1507703",
    "slo_aware/bursty": "07d0264777ca54db",
    "fairness/bursty": "697254252554870c",
    "priority/bursty": "015d991d044940e3",
    "sjf/bursty": "230c88ba68a25956",
    "prefill_first/multitenant": "73a52a64d2764f4f",
    "decode_first/multitenant": "0c8d1651b03c1ff3",
    "chunked/multitenant": "cd61228f0c90039e",
    "slo_aware/multitenant": "52f6deb8aa60d7e8",
    "fairness/multitenant": "ab6bffa395c4c534",
    "priority/multitenant": "7b2e67f660640f5c",
    "sjf/multitenant": "574ba607ce4a1571",
    "prefill_first/poisson": "202b5958f354c783",
    "decode_first/poisson": "f94b274017f3d809",
    "chunked/poisson": "3cad99082fe35c71",
    "slo_aware/poisson": "492f92150c63bf24",
    "fairness/poisson": "eb9c1b5611faff80",
    "priority/poisson": "9792ba9bf00d7ea9",
    "sjf/poisson": "99ab2b1c2b7c65f8"
}


def replay_digest(run_dir) -> str:
    requests = pd.read_parquet(run_dir / "requests.parquet")
    summary = json.loads((run_dir / "summary.json").read_text())
    h = hashlib.sha256(requests.to_csv(index=False, float_format=repr).encode())
    numbers = {k: v for k, v in summary.items()     # (trace_report describes the input, not the replay)
               if k not in ("config", "trace_report") and "wall" not in k}
    h.update(json.dumps(numbers, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("case", sorted(DIGESTS))
def test_replay_is_identical(case, tmp_path):
    policy, trace = case.split("/")
    main(["run", f"policy={policy}", f"trace={trace}", "dataplane=sim", "logger=none", "plots=false",
          "progress=false", f"hydra.run.dir={tmp_path}"])
    assert replay_digest(tmp_path) == DIGESTS[case]
