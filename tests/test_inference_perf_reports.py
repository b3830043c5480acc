"""fidelity-e2e on real inference-perf report folders (tests/data/loadgen/inference_perf_cpu_vllm: written
by inference-perf 0.7.0 against vLLM's server on a CPU, see the folder's README): read as they come,
replayed as recorded and rebuilt from config.yaml alone."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from policylab.traces.loadgen.inference_perf import read_inference_perf

pytestmark = pytest.mark.timeout(300)
DATA = Path(__file__).parent / "data" / "loadgen" / "inference_perf_cpu_vllm"


def experiment():
    """experiments/cpu_inference_perf.py (its comparison needs neither vLLM nor inference-perf: the runs are files)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import cpu_inference_perf
    return cpu_inference_perf


def test_a_real_report_folder_reads_as_inference_perf_wrote_it():
    folder = DATA / "quiet" / "run_2"
    bench = read_inference_perf(folder)
    stages = [json.loads((folder / f"stage_{k}_lifecycle_metrics.json").read_text()) for k in (0, 1)]
    assert [s.rate for s in bench.stages] == [4.0, 12.0]
    assert [bench.stage_of.count(k) for k in (0, 1)] == [s["load_summary"]["count"] for s in stages] == [60, 120]
    for measured, stage in zip(bench.stages, stages):
        latency = stage["successes"]["latency"]
        assert measured.ttft_mean == latency["time_to_first_token"]["mean"]
        assert measured.e2e_mean == latency["request_latency"]["mean"]
    assert {r.prompt_tokens for r in bench.requests} == {192}               # 64 shared + 128 (no BOS here)
    assert len({r.prefix_hashes for r in bench.requests}) == 20             # 4 groups x 5 prompts, in a cycle
    assert len({r.prefix_hashes[0] for r in bench.requests}) == 4
    assert bench.client_timeout == 300.0 and bench.concurrency is None       # 1 worker x 100: never reached


def test_real_runs_replay_within_a_fifth_as_recorded_and_rebuilt():
    """The sim fitted on vLLM's steps, with the probes' host time and client latency: TTFT, E2E and the
    per-token interval within 20 % of the run, from its records and from config.yaml alone (the sim is
    3-13 % fast on these: inference-perf's client shares the machine's two cores with the server)."""
    rows = experiment().compare(DATA / "quiet", DATA / "quiet" / "calibration.json", 64)
    assert len(rows) == 2 * 2 * 3                                           # two ways x two stages x three metrics
    assert {r["metric"].split(":")[0].split(", ")[1] for r in rows} == {"as recorded", "rebuilt from config.yaml"}
    for row in rows:
        assert abs(row["error_to_mean"]) < 0.2, row


def test_an_overloaded_capped_run_whose_clients_gave_up_replays_with_its_cap_and_timeout():
    """60 req/s for 5 s, one worker holding at most 32 requests, clients giving up after 1 s: 156 of the
    300 failed, with no prompt token count in the report (filled from the same prompt answered). Rebuilt
    from config.yaml, the replay keeps at most 32 in flight and its clients give up after 1 s too."""
    folder = DATA / "overload" / "run_0"
    recorded = read_inference_perf(folder)
    assert recorded.stages[0].requests_failed == 156 and recorded.client_timeout == 1.0
    assert any("156 failed request(s) without their prompt's token count" in n for n in recorded.notes)
    assert {r.prompt_tokens for r in recorded.requests} == {192}
    rows = {r["metric"]: r for r in experiment().compare(DATA / "overload", DATA / "overload" / "calibration.json", 64)}
    failed = [r for name, r in rows.items() if "failed requests" in name]
    assert len(failed) == 2 and all(r["predicted"][0] > 100 for r in failed)     # the replays' clients gave up too
    rebuilt = rows["stage 0 (60 req/s), rebuilt from config.yaml: E2E"]
    assert abs(rebuilt["error_to_mean"]) < 0.2, rebuilt


def test_rebuilt_it_keeps_at_most_the_workers_slots_in_flight(tmp_path):
    import shutil

    from policylab.apps import fidelity_e2e
    from policylab.apps.e2e_replay import replay_benchmark
    folder = tmp_path / "run_0"
    shutil.copytree(DATA / "overload" / "run_0", folder)
    (folder / "per_request_lifecycle_metrics.json").unlink()
    bench = fidelity_e2e.load_benchmark(fidelity_e2e.build_parser().parse_args(
        [str(folder), "--model", "tiny", "--gpu", "cpu", "--max-num-seqs", "16", "--block-size", "32"]))
    assert bench.concurrency == (32,)
    result, _ = replay_benchmark(bench, ["trace.client_timeout=1.0"])
    spans = [(t.arrival_time, r.finish_time) for t, r in zip(result.trace, result.requests)]
    assert max(sum(1 for a, f in spans if a <= t < f) for t, _ in spans) == 32
