"""Replays stay identical: every shipped policy on the shipped traces, sim data plane, through
the CLI job, hashes to the digest recorded when the package was restructured into layers.

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
    "prefill_first/bursty": "851edd41b4e5e60d",
    "decode_first/bursty": "bbd20a9d5bd56384",
    "chunked/bursty": "e560485d5a1f9ce5",
    "slo_aware/bursty": "43a518a85068a50b",
    "fairness/bursty": "6025989a81ead819",
    "priority/bursty": "d658a5d22f714995",
    "sjf/bursty": "6822d2b39a55092a",
    "prefill_first/multitenant": "8a1c882e1bbfb391",
    "decode_first/multitenant": "3785ef46bbca633a",
    "chunked/multitenant": "91f9d245764b9397",
    "slo_aware/multitenant": "985788be9b22a269",
    "fairness/multitenant": "16d937a572b114b5",
    "priority/multitenant": "8de730a7f38024cd",
    "sjf/multitenant": "83ad8cd01f9f6775",
    "prefill_first/poisson": "22be9d5d77460e16",
    "decode_first/poisson": "38cff39449639226",
    "chunked/poisson": "4b4e517223af794d",
    "slo_aware/poisson": "bdc9001c39a563f3",
    "fairness/poisson": "9441ea1ff52861aa",
    "priority/poisson": "cfd38326bdce948c",
    "sjf/poisson": "d441721a72d5348b"
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
