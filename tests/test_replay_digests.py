"""Replays stay identical: every shipped policy on the shipped traces, sim data plane, through
the CLI job, hashes to a fixed table (tests/run_digest.py says what a digest covers: every
column of requests.parquet exactly and every summary number at 12 significant digits, not the
config echo, the input's trace_report, or wall-clock fields).

A change that moves these on purpose (a new cost model, a policy fix) updates the table here
and says why in its commit. The table is that of the default cost model (`cost_model=shaped`)
in the default serving engine (`serving_engine=vllm`); ROOFLINE_DIGESTS are results recorded with
the former default, which `cost_model=roofline serving_engine=none` still reproduces (on the H100's
datasheet memory, `hardware.mem_bytes=80e9`, which KV blocks were counted from before). `python tests/test_replay_digests.py` prints the current table.
"""
from __future__ import annotations

import pytest

from policylab.apps.cli import main
from run_digest import replay_digest

DIGESTS = {
    "chunked/bursty": "43e03f8e54f2bd1e",
    "chunked/multitenant": "f390cda530d84755",
    "chunked/poisson": "eb8065a38e5f2c07",
    "decode_first/bursty": "ed35f312e3a46c19",
    "decode_first/multitenant": "013b082ff79e00aa",
    "decode_first/poisson": "09e27e2fc7f2187f",
    "fairness/bursty": "87ab62df56c217b7",
    "fairness/multitenant": "1b8d57eb5a26a689",
    "fairness/poisson": "102c21cac7bde385",
    "prefill_first/bursty": "0ffd65508eca2fc7",
    "prefill_first/multitenant": "8ba967f7b980bbc6",
    "prefill_first/poisson": "dffb1e7dd671612e",
    "priority/bursty": "1eece01d16b8196d",
    "priority/multitenant": "2c48124e3145233e",
    "priority/poisson": "62c5068c1680c5a1",
    "sjf/bursty": "364a19afd3f4b4ed",
    "sjf/multitenant": "89b7601c4f66aa08",
    "sjf/poisson": "46c53cf1cb017742",
    "slo_aware/bursty": "d06f8824e0908aa3",
    "slo_aware/multitenant": "fb34ac92bbd76e74",
    "slo_aware/poisson": "5850be3232fed14c"
}


PINNED = {"prefill_first": ["policy.watermark=0"]}   # the digests predate prefill_first's watermark

# recorded with the former default cost model and no serving engine, on the H100's datasheet memory:
# `dataplane.cost_model=roofline serving_engine=none hardware.mem_bytes=80e9` reproduces them
ROOFLINE_DIGESTS = {
    "chunked/poisson": "2d698d147c825aa2",
    "prefill_first/bursty": "d043f0f9f8041dde",
    "sjf/multitenant": "3088325d7f4d6103",
}


# recorded with the shaped model before serving engines and before the H100's persistent GEMMs:
# `serving_engine=none` (kernel time only) with the wave model's GEMMs on the H100
# (`hardware.persistent_gemm_efficiency=null`) and its datasheet memory is that model number for number
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
          "dataplane.cost_model=roofline", "serving_engine=none", "hardware.mem_bytes=80e9", "logger=none", "plots=false", "progress=false",
          f"hydra.run.dir={tmp_path}"])
    assert replay_digest(tmp_path) == ROOFLINE_DIGESTS[case]


@pytest.mark.parametrize("case", sorted(SHAPED_WITHOUT_ENGINE_DIGESTS))
def test_the_none_engine_reproduces_results_recorded_before_serving_engines(case, tmp_path):
    policy, trace = case.split("/")
    main(["run", f"policy={policy}", *PINNED.get(policy, []), f"trace={trace}", "dataplane=sim", "serving_engine=none",
          "hardware.persistent_gemm_efficiency=null", "hardware.mem_bytes=80e9", "logger=none", "plots=false", "progress=false",
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
