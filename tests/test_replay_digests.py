"""Replays stay identical: every shipped policy on the shipped traces, sim data plane, through
the CLI job, hashes to a fixed table (tests/run_digest.py says what a digest covers: every
column of requests.parquet exactly and every summary number at 12 significant digits, not the
config echo, the input's trace_report, or wall-clock fields).

A change that moves these on purpose (a new cost model, a policy fix) updates the table here
and says why in its commit (goodput over the makespan, the denominator of throughput, moved every
summary's goodput and nothing else). The table is that of the default cost model (`cost_model=shaped`);
ROOFLINE_DIGESTS are results recorded with the former default, which `cost_model=roofline`
still reproduces. `python tests/test_replay_digests.py` prints the current table.
"""
from __future__ import annotations

import pytest

from policylab.apps.cli import main
from run_digest import replay_digest

DIGESTS = {
    "chunked/bursty": "241274c1356bf43b",
    "chunked/multitenant": "bc52f17f61f4c568",
    "chunked/poisson": "747f6600ac7d36c0",
    "decode_first/bursty": "f0dff0bd84c18925",
    "decode_first/multitenant": "26d3c844cafd8ee7",
    "decode_first/poisson": "3b78433d97bcaf96",
    "fairness/bursty": "8a19b64930917e65",
    "fairness/multitenant": "f4a2668e0c9a0171",
    "fairness/poisson": "12830c3eb8a2297a",
    "prefill_first/bursty": "bb24bcc879a5dae5",
    "prefill_first/multitenant": "890880e87f754d51",
    "prefill_first/poisson": "9468de63a295f6da",
    "priority/bursty": "21d0625925664881",
    "priority/multitenant": "fa77370b8e972416",
    "priority/poisson": "cebfccbf7d76f0cc",
    "sjf/bursty": "930230b2b49de80c",
    "sjf/multitenant": "d02233eb73e9d090",
    "sjf/poisson": "84961645ab231748",
    "slo_aware/bursty": "e308653f4bebb190",
    "slo_aware/multitenant": "f50ca2731315e39c",
    "slo_aware/poisson": "0237fb43950fd202"
}


PINNED = {"prefill_first": ["policy.watermark=0"]}   # the digests predate prefill_first's watermark

# recorded with the former default cost model: `dataplane.cost_model=roofline` reproduces them
ROOFLINE_DIGESTS = {
    "chunked/poisson": "2d698d147c825aa2",
    "prefill_first/bursty": "d043f0f9f8041dde",
    "sjf/multitenant": "3088325d7f4d6103",
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
