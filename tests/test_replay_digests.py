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
    "chunked/bursty": "b0dad8b586864871",
    "chunked/multitenant": "cfd727677c1ceaf3",
    "chunked/poisson": "4f6a332c36471f91",
    "decode_first/bursty": "fd2d328a6fe6034e",
    "decode_first/multitenant": "c897aa9f037a4005",
    "decode_first/poisson": "b2209212d8f3f9fb",
    "fairness/bursty": "72f7e8feab5b0f77",
    "fairness/multitenant": "ffa65c3bde6017ae",
    "fairness/poisson": "e1b63f68f14d3f1b",
    "prefill_first/bursty": "e011e0351073901a",
    "prefill_first/multitenant": "1db4712c70ab5386",
    "prefill_first/poisson": "958f5b84db610d0a",
    "priority/bursty": "fa64b158e80310ad",
    "priority/multitenant": "c9a7ae2bb3b2923f",
    "priority/poisson": "f4fa49d79010e1d8",
    "sjf/bursty": "a62b729351dc6a39",
    "sjf/multitenant": "b59b488d16622596",
    "sjf/poisson": "4ce8bea8801d774f",
    "slo_aware/bursty": "05a7b071e0d44ffa",
    "slo_aware/multitenant": "d5570b608f72a96c",
    "slo_aware/poisson": "e64056a8a87cf18b"
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
