"""Replays stay identical: every shipped policy on the shipped traces, sim data plane, through
the CLI job, hashes to a fixed table (tests/run_digest.py says what a digest covers: every
column of requests.parquet exactly and every summary number at 12 significant digits, not the
config echo, the input's trace_report, or wall-clock fields).

A change that moves these on purpose (a new cost model, a policy fix) updates the table here
and says why in its commit. The table is that of the default cost model (`cost_model=shaped`);
ROOFLINE_DIGESTS are results recorded with the former default, which `cost_model=roofline`
still reproduces. `python tests/test_replay_digests.py` prints the current table.
"""
from __future__ import annotations

import pytest

from policylab.apps.cli import main
from run_digest import replay_digest

DIGESTS = {
    "prefill_first/bursty": "251dd0800fd3fe3b",
    "decode_first/bursty": "491bc7d76a8202d6",
    "chunked/bursty": "6c2cfb5fda0aa551",
    "slo_aware/bursty": "a8eb5eaa20b6072e",
    "fairness/bursty": "7a44bc820d391cbf",
    "priority/bursty": "c661a20026e1394d",
    "sjf/bursty": "ed4ea68237806e48",
    "prefill_first/multitenant": "1688c3f291de682a",
    "decode_first/multitenant": "b321af7a01fa3462",
    "chunked/multitenant": "83ee85549c4c6a66",
    "slo_aware/multitenant": "3428c640b3cd5a45",
    "fairness/multitenant": "290fb68adf08b716",
    "priority/multitenant": "8c3b9dbad5262a6e",
    "sjf/multitenant": "443b1bb8eb5e0447",
    "prefill_first/poisson": "bb0aae32ffe58303",
    "decode_first/poisson": "3f2f64e78f15dfcd",
    "chunked/poisson": "341fe502cb51463c",
    "slo_aware/poisson": "4b99c64120c4555d",
    "fairness/poisson": "411993355e21682d",
    "priority/poisson": "7082d5b46a21d510",
    "sjf/poisson": "e265fd2b6b929f01"
}


PINNED = {"prefill_first": ["policy.watermark=0"]}   # the digests predate prefill_first's watermark

# recorded with the former default cost model: `dataplane.cost_model=roofline` reproduces them
ROOFLINE_DIGESTS = {
    "chunked/poisson": "81f99ee902ee7403",
    "prefill_first/bursty": "b7eaaa31420e01de",
    "sjf/multitenant": "e15ef9691d0cd840",
}


@pytest.mark.parametrize("case", sorted(DIGESTS))
def test_replay_is_identical(case, tmp_path):
    policy, trace = case.split("/")
    main(["run", f"policy={policy}", *PINNED.get(policy, []), f"trace={trace}", "dataplane=sim", "logger=none",
          "plots=false", "progress=false", f"hydra.run.dir={tmp_path}"])
    assert replay_digest(tmp_path) == DIGESTS[case]


@pytest.mark.parametrize("case", sorted(ROOFLINE_DIGESTS))
def test_the_roofline_reproduces_results_recorded_before_the_shaped_default(case, tmp_path):
    policy, trace = case.split("/")
    main(["run", f"policy={policy}", *PINNED.get(policy, []), f"trace={trace}", "dataplane=sim",
          "dataplane.cost_model=roofline", "logger=none", "plots=false", "progress=false", f"hydra.run.dir={tmp_path}"])
    assert replay_digest(tmp_path) == ROOFLINE_DIGESTS[case]


if __name__ == "__main__":
    import json
    import sys
    import tempfile
    from pathlib import Path
    table = {}
    for case in sorted(DIGESTS):
        policy, trace = case.split("/")
        with tempfile.TemporaryDirectory() as d:
            main(["run", f"policy={policy}", *PINNED.get(policy, []), f"trace={trace}", "dataplane=sim",
                  "logger=none", "plots=false", "progress=false", f"hydra.run.dir={d}"])
            table[case] = replay_digest(Path(d))
    print(json.dumps(table, indent=4), file=sys.stderr)
