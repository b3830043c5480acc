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
    "chunked/bursty": "0dd748c99fd6c6f3",
    "chunked/multitenant": "7801259e90b3e74a",
    "chunked/poisson": "af8e25118d976735",
    "decode_first/bursty": "62c9ee31670dc2c4",
    "decode_first/multitenant": "75af909b31419f4c",
    "decode_first/poisson": "4a05dea943bc41b8",
    "fairness/bursty": "b0b9107a6c9dcb1a",
    "fairness/multitenant": "31150442663ba2cc",
    "fairness/poisson": "492ff0f371722c96",
    "prefill_first/bursty": "58a8a74485722577",
    "prefill_first/multitenant": "a54f7b8d39c1b386",
    "prefill_first/poisson": "4f5bb3ee6d062173",
    "priority/bursty": "347427fce70262ca",
    "priority/multitenant": "bb866d4973f1eadd",
    "priority/poisson": "ddd4b9e64249a060",
    "sjf/bursty": "dfeb05077763d9ba",
    "sjf/multitenant": "d1901aeb722f9b53",
    "sjf/poisson": "7cf8069a2a24a1be",
    "slo_aware/bursty": "cfe0758ad8761772",
    "slo_aware/multitenant": "5cba4a5660485cda",
    "slo_aware/poisson": "4714f3792a462c6c"
}


PINNED = {"prefill_first": ["policy.watermark=0"]}   # the digests predate prefill_first's watermark

# recorded with the former default cost model and no serving engine: `dataplane.cost_model=roofline
# serving_engine=none` reproduces them
ROOFLINE_DIGESTS = {
    "chunked/poisson": "2d698d147c825aa2",
    "prefill_first/bursty": "d043f0f9f8041dde",
    "sjf/multitenant": "3088325d7f4d6103",
}


# recorded with the shaped model before serving engines and before the H100's persistent GEMMs:
# `serving_engine=none` (kernel time only) with the wave model's GEMMs on the H100
# (`hardware.persistent_gemm_efficiency=null`) is that model number for number
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
          "hardware.persistent_gemm_efficiency=null", "logger=none", "plots=false", "progress=false",
          f"hydra.run.dir={tmp_path}"])
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
