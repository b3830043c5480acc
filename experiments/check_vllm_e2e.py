"""The simulator against real vLLM serving on H100, end to end: the development split.

Each row of FILE (the development split of a public set of real vLLM v1 runs on H100, one row per
load stage; its README says what each column means) is rebuilt as the load generator sent it
(inference-perf's shared_prefix workload: prompts sent in a fixed cycle, groups sharing a system
prompt, Poisson-conditioned arrivals, ignore_eos outputs) and replayed with `policy=vllm_v1` and
the row's model, TP and vLLM knobs (policylab.apps.e2e_replay, as `fidelity-e2e` does). Printed:
per stage the measured and predicted TTFT mean, E2E mean and per-token interval with the error,
whether the sim saturated, and the MAPE of each over the stages; then, for each stage whose mean TTFT sits
well above its median, the equal stalls that would give both its mean and its p99 TTFT (`tail_size`);
last, each run's KV cache: its size, the most of it in use, and the preemptions.

    python experiments/check_vllm_e2e.py FILE [--duration S] [--model NAME=PRESET] [extra overrides...]

--duration replays each stage for S seconds instead of its recorded 600 (a quicker, noisier check).
A row's model and GPU are the presets their names spell ("meta-llama/Llama-2-70b-chat-hf" is
llama2-70b, "H100-80GB" h100); --model NAME=PRESET (or NAME=path/to/config.json) maps a model whose
name spells none. A cell that is not what its column holds stops the check with the file, line and
column; a stage whose every request failed has empty latency cells, and is replayed and shown with dashes.

A run with failed requests (clients that gave up under overload) is replayed with clients that give up
too, after `--client-timeout` seconds (default: the file's `client_timeout_s` column where it has one,
else inference-perf's default, aiohttp's total timeout of 300 s; `none`: never, and such stages are
reported `overloaded`): its overloaded stages then compare on their survivors, in a MAPE of their own
beside the normal-load stages'.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from policylab.apps.e2e_replay import error_text, mape, pair_text, replay_and_compare, tail_size  # noqa: E402
from policylab.apps.fidelity_e2e import replay_timeout, seconds_or_none  # noqa: E402
from policylab.apps.config import presets  # noqa: E402
from policylab.apps.served_names import gpu_preset, model_preset  # noqa: E402
from policylab.traces.csv_table import cell_value, csv_rows  # noqa: E402
from policylab.traces.errors import TraceError, shown  # noqa: E402
from policylab.traces.loadgen.benchmark import Benchmark, MeasuredStage, ServerKnobs  # noqa: E402
from policylab.traces.shared_prefix import SharedPrefixWorkload, Stage, shared_prefix_trace  # noqa: E402

STAGE_GAP_S = 60.0
# (column, least, most) of the whole-number and the other numeric columns: past these a row is a slip
INTEGERS = (("tensor_parallel", 1, 1024), ("max_num_seqs", 1, 1 << 20), ("max_num_batched_tokens", 1, 1 << 24),
            ("max_model_len", 1, 1 << 24), ("block_size", 1, 1 << 16), ("num_groups", 1, 1 << 20),
            ("prompts_per_group", 1, 1 << 20), ("system_prompt_len", 0, 1 << 24), ("output_len", 1, 1 << 24),
            ("stage", 0, 1 << 20), ("requests_ok", 0, 1 << 40), ("requests_failed", 0, 1 << 40))
NUMBERS = (("gpu_memory_utilization", 0.0, 1.0), ("rate_req_s", 0.0, 1e9), ("duration_s", 0.0, 1e9),
           ("prompt_len_median", 0.0, 1 << 24))
LATENCIES = ("ttft_mean_s", "e2e_mean_s", "per_token_interval_mean_s")      # empty where no request finished
OPTIONAL = ("ttft_median_s", "ttft_p99_s", "client_timeout_s")             # columns a file may leave out
TEXT = ("model", "gpu", "workload", "prefix_caching")
INFERENCE_PERF_TIMEOUT_S = 300.0     # inference-perf without load.request_timeout: aiohttp's total timeout


def benchmarks(path: Path, duration: float | None, models: dict | None = None) -> list:
    """One Benchmark per (model, TP, workload) of the file, its stages in order. A row's model is
    `models[name]` where given (a configs/model preset, or a config.json for model=hf), else the preset
    its name means (policylab.apps.served_names); its GPU the hardware preset its name means."""
    runs, served = defaultdict(list), {}
    for row in read_rows(path):
        runs[(row["model"], row["tensor_parallel"], row["workload"])].append(row)
        if row["model"] not in served:
            served[row["model"]] = served_model(path, row["line"], row["model"], models or {})
        try:
            row["gpu"] = gpu_preset(row["gpu"])
        except ValueError as e:
            raise TraceError(str(path), row["line"], "gpu", str(e), kind="column") from None
    out = []
    for (model, tp, workload), rows in runs.items():
        rows.sort(key=lambda r: r["stage"])
        r0 = rows[0]
        groups, per_group = r0["num_groups"], r0["prompts_per_group"]
        prompt = int(round(r0["prompt_len_median"]))
        system = r0["system_prompt_len"] + 1            # + BOS
        output = r0["output_len"]
        load = SharedPrefixWorkload(groups, per_group, system, [prompt] * (groups * per_group),
                                    [output] * (groups * per_group))
        stages = [Stage(r["rate_req_s"], duration or r["duration_s"]) for r in rows]
        requests, stage_of = shared_prefix_trace(load, stages, STAGE_GAP_S, seed=0)
        measured = [MeasuredStage(r["stage"], r["rate_req_s"], r["requests_ok"], r["requests_failed"], r["ttft_mean_s"],
                                  r["e2e_mean_s"], r["per_token_interval_mean_s"], output, r["duration_s"],
                                  ttft_median=r["ttft_median_s"], ttft_p99=r["ttft_p99_s"])
                    for r in rows]
        server = ServerKnobs(tp, r0["max_num_seqs"], r0["max_num_batched_tokens"], r0["block_size"],
                             r0["gpu_memory_utilization"], r0["prefix_caching"], r0["max_model_len"])
        timeout = INFERENCE_PERF_TIMEOUT_S if math.isnan(r0["client_timeout_s"]) else r0["client_timeout_s"]
        preset, config = served[model]
        out.append(Benchmark(f"{model} TP{tp} {workload}", preset, r0["gpu"], server, requests, stage_of, measured,
                             prefix_block_tokens=system, client_timeout=timeout, model_config=config))
    return out


def read_rows(path: Path) -> list:
    """The file's rows with their numbers as numbers (the one CSV reader, policylab.traces.csv_table): a
    cell that is not what its column holds is a TraceError naming the file, line and column. A measured
    latency or an optional column's cell may be empty: NaN."""
    name = str(path)
    columns = (*TEXT, *(c for c, _, _ in INTEGERS + NUMBERS), *LATENCIES)
    rows = []
    for line, raw in csv_rows(path, name, columns, optional=OPTIONAL,
                              expected="a table in the development split's format"):
        row = {key: raw[key] for key in TEXT}
        row.update({key: int(cell_value(raw[key], name, line, key, low, high, integer=True))
                    for key, low, high in INTEGERS})
        row.update({key: cell_value(raw[key], name, line, key, low, high, above=True) for key, low, high in NUMBERS})
        row.update({key: math.nan if raw.get(key, "").lower() in ("", "nan") else
                    cell_value(raw[key], name, line, key, 0.0, 1e9, above=key == "client_timeout_s", unit="s")
                    for key in (*LATENCIES, *OPTIONAL)})
        if row["prefix_caching"].lower() not in ("true", "false"):
            raise TraceError(name, line, "prefix_caching",
                             f"expected True or False, got {shown(row['prefix_caching'])}", kind="column")
        row["prefix_caching"] = row["prefix_caching"].lower() == "true"
        rows.append({**row, "line": line})
    return rows


def served_model(path: Path, line: int, name: str, models: dict) -> tuple:
    """(configs/model preset, config.json or None) of a row's model: `--model NAME=...` first, else the
    preset its name means; a clear error where neither gives one."""
    given = models.get(name)
    if given is None:
        preset = model_preset(name)
        if preset is None:
            raise TraceError(str(path), line, "model", f"'{name}' names no configs/model preset; map it: "
                             f"--model '{name}=PRESET' or --model '{name}=path/to/config.json'", kind="column")
        return preset, None
    if given.endswith(".json"):
        if not Path(given).is_file():
            raise SystemExit(f"--model {name}={given}: no such config.json")
        return "hf", given
    known = presets("model")
    if given not in known:
        raise SystemExit(f"--model {name}={given}: no configs/model preset '{given}'; one of {', '.join(known)}")
    return given, None


def model_mapping(text: str) -> tuple:
    name, sep, preset = text.rpartition("=")
    if not sep or not name or not preset:
        raise argparse.ArgumentTypeError(f"expected NAME=PRESET or NAME=config.json, got '{text}'")
    return name, preset


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--duration", type=float, default=None)
    ap.add_argument("--client-timeout", type=seconds_or_none, default=None, metavar="SECONDS|none",
                    help="clients give up after this (runs with failed requests; default: the file's, else 300 s)")
    ap.add_argument("--model", type=model_mapping, action="append", default=[], metavar="NAME=PRESET",
                    help="the model preset (or config.json) of the file's model NAME, where its name spells none")
    ap.add_argument("overrides", nargs="*", help="extra run overrides, e.g. serving_engine=none")
    args = ap.parse_intermixed_args(argv)
    rows, runs, caches = [], {}, []
    try:
        benches = benchmarks(args.file, args.duration, dict(args.model))
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("| run | stage | rate | TTFT meas / pred (ms) | err | E2E meas / pred (s) | err | "
          "per-token meas / pred (ms) | err | sim |\n|---|---|---|---|---|---|---|---|---|---|")
    started = time.perf_counter()
    for bench in benches:
        compared, _, _, kv = replay_and_compare(bench, args.overrides, replay_timeout(args.client_timeout, bench))
        caches.append(f"KV cache, {bench.name}: {kv.describe()}")
        for c in compared:
            m, p, e = c.measured, c.predicted, c.errors
            rows.append(c)
            runs.setdefault(bench.name, []).append(c)
            print(f"| {bench.name} | {m.stage} | {m.rate:g} | "
                  f"{pair_text(m.ttft_mean, p.ttft_mean, 1e3, '.1f')} | {error_text(e, 'ttft_mean')} | "
                  f"{pair_text(m.e2e_mean, p.e2e_mean, 1, '.2f')} | {error_text(e, 'e2e_mean')} | "
                  f"{pair_text(m.per_token_interval, p.per_token_interval, 1e3, '.2f')} | "
                  f"{error_text(e, 'per_token_interval')} | {c.status} |")
    wrong = sum(1 for c in rows if (c.status == "saturated") != bool(c.measured.requests_failed))
    normal = [c for c in rows if not c.measured.requests_failed]
    print(f"\nMAPE over {len(normal)} stages: E2E {mape(normal, 'e2e_mean') * 100:.1f} %, TTFT "
          f"{mape(normal, 'ttft_mean') * 100:.1f} %, per-token interval {mape(normal, 'per_token_interval') * 100:.1f} %; "
          f"stages predicted saturated wrongly: {wrong}  ({time.perf_counter() - started:.0f} s)")
    overloaded = [c for c in rows if c.measured.requests_failed and c.errors]
    if overloaded:
        print(f"overloaded stages on their survivors ({len(overloaded)}, clients giving up as they did): E2E "
              f"{mape(overloaded, 'e2e_mean') * 100:.1f} %, TTFT {mape(overloaded, 'ttft_mean') * 100:.1f} %, "
              f"per-token interval {mape(overloaded, 'per_token_interval') * 100:.1f} %; failed measured / predicted "
              + ", ".join(f"{c.measured.requests_failed} / {c.predicted.failed}" for c in overloaded))
    print(ttft_multiples(runs))
    for line in ttft_tails(runs) + caches:
        print(line)
    return 0


def ttft_tails(runs: dict) -> list:
    """A line for each stage whose mean TTFT sits well above its median, the tail sized as the stalls
    that would give both its mean and its p99 (`tail_size`). The replay serves a warm engine and has
    no such stalls."""
    return [f"TTFT tail, {name} stage {c.measured.stage}: {size}" for name, stages in runs.items() for c in stages
            if (size := tail_size(c.measured))]


def ttft_multiples(runs: dict) -> str:
    """TTFT as a multiple of the per-token interval at each run's lightest stage, measured and
    predicted: a request joins at a step boundary and its first token reaches the client after the
    step's output is processed, so light-load TTFT is a few steps, not one."""
    lightest = {name: min(stages, key=lambda c: c.measured.rate) for name, stages in runs.items()}
    ratios = [(c.measured.ttft_mean / c.measured.per_token_interval, c.predicted.ttft_mean / c.predicted.per_token_interval)
              for c in lightest.values() if c.measured.per_token_interval and c.predicted.per_token_interval]
    if not ratios:
        return ""
    meas, pred = zip(*ratios)
    return (f"TTFT / per-token interval at each run's lightest stage: measured {min(meas):.1f}-{max(meas):.1f}x, "
            f"predicted {min(pred):.1f}-{max(pred):.1f}x ({len(ratios)} stages)")


if __name__ == "__main__":
    raise SystemExit(main())
