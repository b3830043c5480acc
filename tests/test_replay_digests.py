"""Replays stay identical: every shipped policy on the shipped traces, sim data plane, through
the CLI job, hashes to a fixed table (tests/run_digest.py says what a digest covers: every
column of requests.parquet exactly and every summary number at 12 significant digits, not the
config echo, the input's trace_report, or wall-clock fields).

A change that moves these on purpose (a new cost model, a policy fix) updates the table here
and says why in its commit. The table is that of the default cost model (`cost_model=shaped`)
in the default serving engine (`serving_engine=vllm`); ROOFLINE_DIGESTS are results recorded with
the former default, which `cost_model=roofline serving_engine=none` still reproduces. `python tests/test_replay_digests.py` prints the current table.
"""
from __future__ import annotations

import pytest

from policylab.apps.cli import main
from run_digest import replay_digest

DIGESTS = {
    "chunked/bursty": "83e640290856095a",
    "chunked/multitenant": "484e8f7c42d5048d",
    "chunked/poisson": "7e350e982ad6bc30",
    "decode_first/bursty": "57247186b21e6305",
    "decode_first/multitenant": "ad15711a7384c2f4",
    "decode_first/poisson": "677f0858550fb2ce",
    "fairness/bursty": "760d80b714b73530",
    "fairness/multitenant": "48b3406a6a1c2657",
    "fairness/poisson": "76ea20f5020736ef",
    "prefill_first/bursty": "3401c9b74b33c9f1",
    "prefill_first/multitenant": "4a6b718d3faa77c0",
    "prefill_first/poisson": "ece685dcdd8cc459",
    "priority/bursty": "e6f98dcbe67d3be7",
    "priority/multitenant": "46644883d9fb1a5f",
    "priority/poisson": "66a1622d8888341a",
    "sjf/bursty": "a5fd4a27311b2665",
    "sjf/multitenant": "35a3564758872a5c",
    "sjf/poisson": "f38a8597bcfb7041",
    "slo_aware/bursty": "eb302818267b7020",
    "slo_aware/multitenant": "a10598d7e8bbac1b",
    "slo_aware/poisson": "c3122cdefe2dc9da"
}


PINNED = {"prefill_first": ["policy.watermark=0"]}   # the digests predate prefill_first's watermark

# recorded with the former default cost model and no serving engine: `dataplane.cost_model=roofline
# serving_engine=none` reproduces them
ROOFLINE_DIGESTS = {
    "chunked/poisson": "2d698d147c825aa2",
    "prefill_first/bursty": "d043f0f9f8041dde",
    "sjf/multitenant": "3088325d7f4d6103",
}


# recorded with the shaped model before serving engines: `serving_engine=none` (kernel time only) is that
# model number for number
SHAPED_WITHOUT_ENGINE_DIGESTS = {
    "chunked/poisson": "747f6600ac7d36c0",
    "prefill_first/bursty": "bb24bcc879a5dae5",
    "sjf/multitenant": "d02233eb73e9d090",
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
          "dataplane.cost_model=roofline", "serving_engine=none", "logger=none", "plots=false", "progress=false",
          f"hydra.run.dir={tmp_path}"])
    assert replay_digest(tmp_path) == ROOFLINE_DIGESTS[case]


@pytest.mark.parametrize("case", sorted(SHAPED_WITHOUT_ENGINE_DIGESTS))
def test_the_none_engine_reproduces_results_recorded_before_serving_engines(case, tmp_path):
    policy, trace = case.split("/")
    main(["run", f"policy={policy}", *PINNED.get(policy, []), f"trace={trace}", "dataplane=sim", "serving_engine=none",
          "logger=none", "plots=false", "progress=false", f"hydra.run.dir={tmp_path}"])
    assert replay_digest(tmp_path) == SHAPED_WITHOUT_ENGINE_DIGESTS[case]


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
