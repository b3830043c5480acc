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
    "chunked/bursty": "cc10a0975f3cc576",
    "chunked/multitenant": "ac541ab9c4bf1d96",
    "chunked/poisson": "9f584601aa609c9b",
    "decode_first/bursty": "4a9cbd4c7fa2ebed",
    "decode_first/multitenant": "e34179b6f755aebe",
    "decode_first/poisson": "b38ada3c7db22a25",
    "fairness/bursty": "a6e644b2e47b2689",
    "fairness/multitenant": "791a4ffbe1ac351e",
    "fairness/poisson": "a65aa471f81bc09d",
    "prefill_first/bursty": "b03a52bffecf78f2",
    "prefill_first/multitenant": "c648b4ef6ace06f9",
    "prefill_first/poisson": "1636f905271c3500",
    "priority/bursty": "7dce88df243a0693",
    "priority/multitenant": "a34379bf4f4f802b",
    "priority/poisson": "4dfae1c7e2f68173",
    "sjf/bursty": "063500b252dc073b",
    "sjf/multitenant": "eaf569a7f8b3dc5e",
    "sjf/poisson": "7f83658d37f05259",
    "slo_aware/bursty": "0ec38106cca5eb4b",
    "slo_aware/multitenant": "80f4154a2089ad85",
    "slo_aware/poisson": "b70ae9389f94458c"
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
