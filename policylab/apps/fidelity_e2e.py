"""`python -m policylab fidelity-e2e RESULT`: the simulator against your own serving benchmark.

RESULT is what a load generator wrote: vLLM's `vllm bench serve --save-result` JSON (or
benchmarks/benchmark_serving.py's; `--append-result` files are read one line a stage), or a
Kubernetes inference-perf report folder (config.yaml + stage_N_lifecycle_metrics.json, and
per_request_lifecycle_metrics.json when it was written). The workload is rebuilt as a trace
(policylab.traces.loadgen), replayed on the sim under `policy=vllm_v1` with the model, GPU, TP and
vLLM's server knobs (flags named as `vllm serve`'s), and each stage's measured TTFT, E2E and
per-token interval is printed next to the prediction with the error. The client's side of the
latency (`serving_engine.client_latency`) is added to the sim's TTFT and E2E, as the load
generator measured them from its side.

A stage with failed requests (client timeouts under overload) has latencies of the survivors
only. Such a run is replayed with its clients' timeout (`trace.client_timeout`): `--client-timeout`,
or the load generator's own where its result says (inference-perf: `load.request_timeout`, or
aiohttp's 300 s when unset), so its survivors compare with the replay's; without one known, the
stage is reported `overloaded`, not compared.

Where the replay agrees with a stage's measured median TTFT but the measured mean sits well above
it, the tail is sized as the few equal stalls that would give both the mean and the p99 (a server
compiling kernels for batch shapes it has not seen yet looks like that; the replay serves a warm
engine).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, replace
from pathlib import Path

from policylab.traces.errors import TraceError

def vllm_defaults(gpu: str) -> tuple:
    """vLLM's OpenAI server defaults of (max_num_batched_tokens, max_num_seqs) on this GPU
    (vllm/engine/arg_utils.py: >= 160 GiB 16384 / 1024; >= 70 GiB and not an A100 8192 / 1024;
    otherwise 2048 / 256)."""
    if gpu in ("b200", "mi300x"):
        return 16384, 1024
    if gpu in ("h100", "h200"):
        return 8192, 1024
    return 2048, 256


def seconds_or_none(text: str):
    """An argparse type: seconds > 0, or the word none (returned as "none")."""
    if text.strip().lower() == "none":
        return "none"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds > 0 or none, got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected seconds > 0 or none, got {text!r}")
    return value


def replay_timeout(flag, bench):
    """Seconds after which the replay's clients give up (None: never): the flag's, else the load
    generator's own where the run had failed requests (a run without any needs none)."""
    if flag == "none":
        return None
    if flag is not None:
        return flag
    if bench.client_timeout is not None and any(s.requests_failed for s in bench.stages):
        return bench.client_timeout
    return None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m policylab fidelity-e2e", description=__doc__.split("\n")[0])
    ap.add_argument("result", type=Path, help="vllm bench serve JSON, or an inference-perf report folder")
    ap.add_argument("overrides", nargs="*", help="more run overrides (serving_engine=vllm_eager, dataplane.cost_model=...)")
    ap.add_argument("--model", default=None, help="a configs/model/ preset (default: from the result's model id)")
    ap.add_argument("--model-config", type=Path, default=None, help="a Hugging Face config.json of the served model")
    ap.add_argument("--gpu", default=None,
                    help="the GPU it ran on: a configs/hardware preset (h100, a100, ...) or its name (\"H100-80GB\")")
    ap.add_argument("--serving-engine", default="vllm", help="a configs/serving_engine/ preset (default: vllm)")
    vllm = ap.add_argument_group("the vLLM server's knobs (as `vllm serve` took them)")
    vllm.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    vllm.add_argument("--max-num-seqs", type=int, default=None, help="default: vLLM's for the GPU")
    vllm.add_argument("--max-num-batched-tokens", type=int, default=None, help="default: vLLM's for the GPU")
    vllm.add_argument("--block-size", type=int, default=16)
    vllm.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    vllm.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    vllm.add_argument("--max-model-len", type=int, default=None)
    vllm.add_argument("--kv-cache-memory-bytes", type=float, default=None, metavar="BYTES",
                      help="KV bytes per GPU (vLLM's flag: then --gpu-memory-utilization does not size the cache)")
    vllm.add_argument("--num-gpu-blocks-override", type=int, default=None, metavar="BLOCKS",
                      help="the KV cache's blocks (default: what gpu_memory_utilization leaves on the GPU, as vLLM "
                           "computes it; to pin the server's own, its startup log's 'GPU KV cache size' / block size)")
    ap.add_argument("--prefix-tokens", type=int, default=0,
                    help="vllm bench serve: tokens every prompt shares (--random-prefix-len; the result does not say)")
    ap.add_argument("--seed", type=int, default=0, help="seed of arrivals drawn where the result has none")
    ap.add_argument("--client-timeout", type=seconds_or_none, default=None, metavar="SECONDS|none",
                    help="the load generator's request timeout, replayed so that overloaded stages compare on "
                         "survivors (default: the result's own, for a run with failed requests; none: never)")
    ap.add_argument("--client-latency", type=float, default=None, metavar="SECONDS",
                    help="seconds the load generator's TTFT and E2E hold beyond the engine's (default: the serving "
                         "engine's client_latency; 0 with a calibration). Measure it: the TTFT of lone requests to the "
                         "idle server, less the one step each ran")
    ap.add_argument("--host-per-step", type=float, default=None, metavar="SECONDS",
                    help="host time the server adds to every step beyond the cost model's (hardware.step_overhead; "
                         "with a calibration measured in process: what the server's own processes add)")
    ap.add_argument("--host-per-request", type=float, default=None, metavar="SECONDS",
                    help="host time the server adds per running request and step (hardware.host_per_request)")
    ap.add_argument("--out", type=Path, default=None, help="write the rebuilt trace and the comparison here")
    return ap


def load_benchmark(args):
    """The result as a Benchmark with the model, GPU and server knobs filled in."""
    from policylab.apps.served_names import gpu_preset, model_preset
    from policylab.traces.loadgen.benchmark import ServerKnobs
    from policylab.traces.loadgen.inference_perf import is_report_folder, read_inference_perf
    from policylab.traces.loadgen.vllm_bench import read_vllm_bench
    path = args.result
    if path.is_dir():
        if not is_report_folder(path):
            raise TraceError(str(path), None, None, "a folder must be an inference-perf report "
                             "(config.yaml and stage_N_lifecycle_metrics.json)")
        bench = read_inference_perf(path, args.seed)
    elif path.is_file():
        bench = read_vllm_bench(path, args.seed, args.prefix_tokens)
    else:
        raise TraceError(str(path), None, None, "no such file or folder")
    if args.gpu is None:
        raise ValueError("which GPU served it? give --gpu (a configs/hardware preset: h100, a100, ...)")
    try:
        gpu = gpu_preset(args.gpu)
    except ValueError as e:
        raise ValueError(f"--gpu {e}") from None
    model, model_config = args.model, args.model_config
    if model is None and model_config is None:
        model = model_preset(bench.model)
        local = Path(bench.model).expanduser()
        if model is None and (local / "config.json").is_file():
            model_config = local / "config.json"
        if model is None and model_config is None:
            raise ValueError(f"the result served '{bench.model}', which has no preset: give --model PRESET or "
                             "--model-config path/to/config.json")
    tokens, seqs = vllm_defaults(gpu)
    server = ServerKnobs(args.tensor_parallel_size, args.max_num_seqs or seqs, args.max_num_batched_tokens or tokens,
                         args.block_size, args.gpu_memory_utilization, args.enable_prefix_caching, args.max_model_len)
    return replace(bench, model=model or "hf", model_config=str(model_config) if model_config else None,
                   gpu=gpu, server=server)


def kv_overrides(args) -> list:
    """vLLM's two flags that size the KV cache other than by --gpu-memory-utilization: its bytes per
    GPU (the sim plane's `kv_cache_memory_bytes`) and its blocks (the engine's `num_blocks`, which wins
    in vLLM too)."""
    out = []
    if args.kv_cache_memory_bytes is not None:
        out.append(f"dataplane.kv_cache_memory_bytes={args.kv_cache_memory_bytes:g}")   # (the plane checks it)
    if args.num_gpu_blocks_override is not None:
        if args.num_gpu_blocks_override < 1:
            raise ValueError(f"--num-gpu-blocks-override: expected blocks >= 1, got {args.num_gpu_blocks_override}")
        out.append(f"engine.num_blocks={args.num_gpu_blocks_override}")
    return out


def host_overrides(args) -> list:
    """The measured host time as a host preset of its own (`hardware.host=measured`), which a
    calibrated cost model adds to its fitted steps too."""
    if args.host_per_step is None and args.host_per_request is None:
        return []
    return ["hardware.host=measured", f"hardware.step_overhead={args.host_per_step or 0.0}",
            f"hardware.host_per_request={args.host_per_request or 0.0}", "hardware.host_per_token=0.0"]


def run(args) -> list:
    from policylab.apps.e2e_replay import replay_and_compare
    # (the host flags are hardware.* overrides, which the config's own checks refuse when bad)
    if args.client_latency is not None and not (math.isfinite(args.client_latency) and args.client_latency >= 0):
        raise ValueError(f"--client-latency: expected seconds >= 0, got {args.client_latency}")
    bench = load_benchmark(args)
    seconds = replay_timeout(args.client_timeout, bench)
    # (the load generator measures from its side of the API: its client latency is added)
    rows, cfg, client, kv = replay_and_compare(bench, [f"serving_engine={args.serving_engine}", *kv_overrides(args),
                                                       *host_overrides(args), *args.overrides], seconds,
                                               args.client_latency)
    report(bench, cfg, rows, client, seconds, kv)
    if args.out:
        write_outputs(args.out, bench, rows)
    return rows


def report(bench, cfg, rows: list, client: float, timeout: float | None = None, kv=None) -> None:
    from policylab.apps.e2e_replay import error_text, mape, pair_text, tail_note
    s = bench.server
    print(f"{bench.name}: {len(bench.requests)} requests in {len(bench.stages)} stage(s); model {cfg.model.name}, "
          f"{bench.gpu} x TP {s.tensor_parallel}, serving_engine {cfg.serving_engine.name} (client latency "
          f"{client * 1e3:.1f} ms), max_num_seqs {s.max_num_seqs}, max_num_batched_tokens {s.max_num_batched_tokens}, "
          f"block {s.block_size}, prefix caching {'on' if s.enable_prefix_caching else 'off'}"
          + (f"; the replay's clients give up after {timeout:g} s" if timeout is not None else ""))
    if kv is not None:
        print(kv_line(kv))
    for note in bench.notes:
        print(f"  ({note})")
    print("\n| stage | rate (req/s) | ok / failed | TTFT measured / predicted (ms) | error | E2E measured / "
          "predicted (s) | error | per-token measured / predicted (ms) | error | status |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in rows:
        m, p, e = c.measured, c.predicted, c.errors

        failed = f"{m.requests_failed}" + (f" ({p.failed} predicted)" if p is not None and p.failed else "")
        print(f"| {m.stage} | {m.rate:g} | {m.requests_ok} / {failed} | "
              f"{pair_text(m.ttft_mean, p and p.ttft_mean, 1e3, '.1f')} | {error_text(e, 'ttft_mean')} | "
              f"{pair_text(m.e2e_mean, p and p.e2e_mean, 1, '.3f')} | {error_text(e, 'e2e_mean')} | "
              f"{pair_text(m.per_token_interval, p and p.per_token_interval, 1e3, '.2f')} | "
              f"{error_text(e, 'per_token_interval')} | "
              f"{c.status} |")
    compared = [c for c in rows if c.errors]
    if compared:
        print(f"\nMAPE over {len(compared)} stage(s): TTFT {mape(rows, 'ttft_mean') * 100:.1f} %, E2E "
              f"{mape(rows, 'e2e_mean') * 100:.1f} %, per-token interval {mape(rows, 'per_token_interval') * 100:.1f} %")
    for note in filter(None, map(tail_note, rows)):
        print(note)
    if any(c.status == "overloaded" for c in rows):
        print("overloaded: requests failed on the client (timeouts); the survivors' latencies are not comparable "
              "with a replay that serves every request: give --client-timeout (the load generator's) to compare them")
    elif timeout is not None and any(c.measured.requests_failed for c in rows):
        print("with failed requests, the survivors are compared: the replay's clients gave up after the same "
              f"{timeout:g} s (failed: measured, and in brackets the replay's)")


def kv_line(kv) -> str:
    """The replay's KV cache against the server's: vLLM logs its size at startup, and a cache that
    fills makes latencies follow its size."""
    if not kv.filled:
        return f"KV cache: {kv.describe()}"
    return (f"KV cache: {kv.describe()}. The cache filled: compare its size with the server's startup log "
            "('GPU KV cache size: N tokens') and pin it with --num-gpu-blocks-override N/block_size")


def write_outputs(out: Path, bench, rows: list) -> None:
    from policylab.traces import write_native
    out.mkdir(parents=True, exist_ok=True)
    write_native(out / "trace.jsonl", bench.requests)
    (out / "comparison.json").write_text(json.dumps([
        {"measured": asdict(c.measured), "predicted": asdict(c.predicted) if c.predicted else None,
         "status": c.status, "errors": c.errors} for c in rows], indent=2, default=float))
    print(f"\nwrote {out / 'trace.jsonl'} (replay it with trace=file trace.path=... "
          f"trace.prefix_block_tokens={bench.prefix_block_tokens}) and {out / 'comparison.json'}")


def main(argv=None) -> int:
    args = build_parser().parse_intermixed_args(argv)
    try:
        run(args)
    except (TraceError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
