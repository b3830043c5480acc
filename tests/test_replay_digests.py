"""Replays stay identical: every shipped policy on the shipped traces, sim data plane, through
the CLI job, hashes to a fixed table (tests/run_digest.py says what a digest covers: every
column of requests.parquet exactly and every summary number at 12 significant digits, not the
config echo, the input's trace_report, or wall-clock fields).

A change that moves these on purpose (a new cost model, a policy fix) updates the table here
and says why in its commit. `python tests/test_replay_digests.py` prints the current table.
"""
from __future__ import annotations

import pytest

from policylab.apps.cli import main
from run_digest import replay_digest

DIGESTS = {
    "prefill_first/bursty": "b7eaaa31420e01de",
    "decode_first/bursty": "ed91d1f6c46e76fb",
    "chunked/bursty": "f72b39eb71076c4a",
    "slo_aware/bursty": "19464e7f1b2cb29d",
    "fairness/bursty": "fdba7bcf2bff7113",
    "priority/bursty": "e97e6693cc3e56cc",
    "sjf/bursty": "78b1fd2021e92eb8",
    "prefill_first/multitenant": "c122559d51711af7",
    "decode_first/multitenant": "4162b445026d01fb",
    "chunked/multitenant": "ff3875d4656844cb",
    "slo_aware/multitenant": "a0b98f40cdce1b64",
    "fairness/multitenant": "22f36c5ceeabb51d",
    "priority/multitenant": "062ade613c6725fb",
    "sjf/multitenant": "e15ef9691d0cd840",
    "prefill_first/poisson": "b575c4f87fa9fc33",
    "decode_first/poisson": "6dcc66290d82836d",
    "chunked/poisson": "81f99ee902ee7403",
    "slo_aware/poisson": "b1b1a78e12d4eb3f",
    "fairness/poisson": "5f8a7236228b89ea",
    "priority/poisson": "05b41f839f31c55d",
    "sjf/poisson": "d39f3579d0243827"
}


@pytest.mark.parametrize("case", sorted(DIGESTS))
def test_replay_is_identical(case, tmp_path):
    policy, trace = case.split("/")
    main(["run", f"policy={policy}", f"trace={trace}", "dataplane=sim", "logger=none", "plots=false",
          "progress=false", f"hydra.run.dir={tmp_path}"])
    assert replay_digest(tmp_path) == DIGESTS[case]


if __name__ == "__main__":
    import json
    import sys
    import tempfile
    from pathlib import Path
    table = {}
    for case in sorted(DIGESTS):
        policy, trace = case.split("/")
        with tempfile.TemporaryDirectory() as d:
            main(["run", f"policy={policy}", f"trace={trace}", "dataplane=sim", "logger=none", "plots=false",
                  "progress=false", f"hydra.run.dir={d}"])
            table[case] = replay_digest(Path(d))
    print(json.dumps(table, indent=4), file=sys.stderr)
