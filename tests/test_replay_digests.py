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
    "chunked/bursty": "b96650aba176353c",
    "chunked/multitenant": "4ead66b824f58272",
    "chunked/poisson": "402b24286f34adfd",
    "decode_first/bursty": "0857eaa9dc340e5c",
    "decode_first/multitenant": "58d87330d1c95aa6",
    "decode_first/poisson": "e827bd6800afcf77",
    "fairness/bursty": "b924dfde7ce42a77",
    "fairness/multitenant": "0b391086298ce5ca",
    "fairness/poisson": "781d88dd0e2bc834",
    "prefill_first/bursty": "729a4157b54ecd84",
    "prefill_first/multitenant": "f864a11588da417c",
    "prefill_first/poisson": "961a7e86cc1c9a4d",
    "priority/bursty": "188a997218ec4900",
    "priority/multitenant": "5458a43eee372e30",
    "priority/poisson": "aa76fe2606982d04",
    "sjf/bursty": "3a04bbabc772a216",
    "sjf/multitenant": "eb1dad6d66581057",
    "sjf/poisson": "888d5623dc87c66a",
    "slo_aware/bursty": "f882563e0bfdf065",
    "slo_aware/multitenant": "1435dbe7432e4755",
    "slo_aware/poisson": "06cc13078ea76586"
}


PINNED = {"prefill_first": ["policy.watermark=0"]}   # the digests predate prefill_first's watermark

# recorded with the former default cost model and no serving engine: `dataplane.cost_model=roofline
# serving_engine=none` reproduces them
ROOFLINE_DIGESTS = {
    "chunked/poisson": "81f99ee902ee7403",
    "prefill_first/bursty": "b7eaaa31420e01de",
    "sjf/multitenant": "e15ef9691d0cd840",
}


# recorded with the shaped model before serving engines: `serving_engine=none` (kernel time only) is that
# model number for number
SHAPED_WITHOUT_ENGINE_DIGESTS = {
    "chunked/poisson": "9f584601aa609c9b",
    "prefill_first/bursty": "b03a52bffecf78f2",
    "sjf/multitenant": "eaf569a7f8b3dc5e",
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
