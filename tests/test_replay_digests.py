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
    "prefill_first/bursty": "928e527a00319cc2",
    "decode_first/bursty": "315630801d70cb83",
    "chunked/bursty": "446f5fa27cadd7c7",
    "slo_aware/bursty": "ded8e67a20715964",
    "fairness/bursty": "ce00be9cc6c5c09c",
    "priority/bursty": "0b9fe8dd955d46c0",
    "sjf/bursty": "04afbe3ddab96e3f",
    "prefill_first/multitenant": "549724a1d0a6d88e",
    "decode_first/multitenant": "46560c734e1fbeef",
    "chunked/multitenant": "4174297b4184b045",
    "slo_aware/multitenant": "c4739f37c804b9e8",
    "fairness/multitenant": "01183c77cf1f6619",
    "priority/multitenant": "80a955491865b6c4",
    "sjf/multitenant": "974661614f7d0573",
    "prefill_first/poisson": "3d4204b62f25aa59",
    "decode_first/poisson": "74baa7562ae7b598",
    "chunked/poisson": "9f9b1447ac55c1b5",
    "slo_aware/poisson": "de964c715a546ce2",
    "fairness/poisson": "c7cab01043975326",
    "priority/poisson": "67865ef64ad161e0",
    "sjf/poisson": "6485b5b909676dae"
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
