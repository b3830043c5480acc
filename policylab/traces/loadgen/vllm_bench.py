"""vLLM's `vllm bench serve` (and benchmarks/benchmark_serving.py) result JSON read as a Benchmark.

`--save-result` writes one JSON object: the setup (`model_id`, `tokenizer_id`, `num_prompts`,
`request_rate` (a number or "inf"), `burstiness`, `max_concurrency`) and the metrics (`completed`,
`failed`, `duration`, `total_input_tokens`, `total_output_tokens`, `mean_ttft_ms`, `mean_e2el_ms`
when `--percentile-metrics` includes e2el, `mean_tpot_ms`, `mean_itl_ms`, ...). `--save-detailed`
adds per request `input_lens`, `output_lens`, `start_times` (the client's clock, seconds),
`ttfts` (s), `itls` (each request's inter-token gaps, s) and `errors`. `--append-result` appends
one such object per line: each line is read as one stage, in order.

With the per-request lists the trace has the requests as sent (start times, lengths) and the
measured means are computed from them as the client measured them (E2E = TTFT + the sum of the
gaps). Without them the arrivals are drawn as `vllm bench serve` draws them (gamma gaps of shape
`burstiness` at `request_rate`, or all at once for "inf") with the mean lengths. The result does not
say which prompts shared a prefix: `prefix_tokens` (all prompts share their first N tokens, as
`--random-prefix-len` or the prefix-repetition dataset's prefix) is the caller's to give. A summary
stage of `--max-concurrency N` keeps at most N requests in flight (`Benchmark.concurrency`): at
`--request-rate inf`, N closed-loop users.

A failed request (its client gave up) records only the tokens it received before that, none when it
was still waiting, and not the tokens it asked for: it is replayed asking for the mean output of the
stage's successful requests (exact for `--ignore-eos` with fixed output lengths, vllm bench serve's
random dataset by default), as its client would have waited for them.
"""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from policylab.core.request import TraceRequest
from policylab.traces.errors import TraceError
from policylab.traces.loadgen.benchmark import Benchmark, MeasuredStage

STAGE_GAP_S = 60.0


def read_objects(path: Path) -> list:
    """The JSON object of a --save-result file, or each line's of an --append-result one."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(str(path), None, None, f"not a readable file ({e})") from None
    try:
        data = json.loads(text)
        objects = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        objects = []
        for line_no, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    objects.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise TraceError(str(path), line_no, None, f"not JSON ({e.msg})") from None
    if not objects or not all(isinstance(o, dict) for o in objects):
        raise TraceError(str(path), None, None, "expected vllm bench serve's result object(s)")
    for i, o in enumerate(objects, 1):
        if "completed" not in o or "num_prompts" not in o:
            raise TraceError(str(path), i, None, "not a vllm bench serve result (no 'completed' / 'num_prompts')")
    return objects


def is_vllm_result(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        read_objects(path)
    except TraceError:
        return False
    return True


def _number(obj: dict, key: str, path: Path, line: int) -> float:
    value = obj.get(key)
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise TraceError(str(path), line, key, f"expected a number, got {value!r}") from None
    if math.isnan(x) or x < 0:
        raise TraceError(str(path), line, key, f"expected a number >= 0, got {value!r}")
    return x


def _detailed(obj: dict) -> bool:
    return all(isinstance(obj.get(k), list) and obj[k] for k in ("input_lens", "output_lens", "start_times", "ttfts"))


def stage_of(obj: dict, k: int, path: Path, seed: int, prefix_tokens: int) -> tuple[list, MeasuredStage]:
    """(requests with arrivals from the stage's start, measured stage) of one result object."""
    rate = obj.get("request_rate", "inf")
    rate = math.inf if rate in ("inf", None) or float(rate) == math.inf else float(rate)
    failed = int(obj.get("failed") or 0)
    if _detailed(obj):
        errors = obj.get("errors") or [""] * len(obj["ttfts"])
        n = len(obj["input_lens"])
        if not all(len(obj[key]) == n for key in ("output_lens", "start_times", "ttfts")):
            raise TraceError(str(path), k + 1, "input_lens", "the per-request lists differ in length")
        t0 = min(float(t) for t in obj["start_times"])
        ttfts, e2es, outs = [], [], []
        for i in range(n):
            if errors[i]:
                continue
            ttft, gaps = float(obj["ttfts"][i]), obj.get("itls", [[]] * n)[i] or []
            ttfts.append(ttft)
            e2es.append(ttft + float(sum(gaps)))
            outs.append(int(obj["output_lens"][i]) or 1)
        # a failed request's recorded output is what it had streamed when its client gave up (nothing, for
        # one still waiting): it asked for as many tokens as the stage's others (module doc)
        asked = int(round(float(np.mean(outs)))) if outs else None
        requests = [_request(float(obj["start_times"][i]) - t0, int(obj["input_lens"][i]),
                             asked if errors[i] and asked else int(obj["output_lens"][i]) or 1, i, prefix_tokens)
                    for i in range(n)]
        failed = sum(1 for e in errors if e)
        ok = len(ttfts)
        ttft_m, e2e_m, out_m = (float(np.mean(x)) if x else math.nan for x in (ttfts, e2es, outs))
        ttft_med, ttft_p99 = (float(q) for q in np.percentile(ttfts, (50, 99))) if ttfts else (math.nan,) * 2
    else:
        ok = int(_number(obj, "completed", path, k + 1))
        ttft_m = _number(obj, "mean_ttft_ms", path, k + 1) / 1e3
        if "mean_e2el_ms" not in obj:
            raise TraceError(str(path), k + 1, "mean_e2el_ms", "no E2E mean: run vllm bench serve with "
                             "--percentile-metrics ttft,tpot,itl,e2el (or --save-detailed)")
        e2e_m = _number(obj, "mean_e2el_ms", path, k + 1) / 1e3
        ttft_med, ttft_p99 = (_number(obj, key, path, k + 1) / 1e3 if obj.get(key) is not None else math.nan
                              for key in ("median_ttft_ms", "p99_ttft_ms"))
        out_m = _number(obj, "total_output_tokens", path, k + 1) / max(ok, 1)
        in_m = _number(obj, "total_input_tokens", path, k + 1) / max(ok, 1)
        count = int(_number(obj, "num_prompts", path, k + 1))
        times = _arrivals(count, rate, float(obj.get("burstiness") or 1.0), seed + k)
        requests = [_request(t, int(round(in_m)), max(1, int(round(out_m))), i, prefix_tokens)
                    for i, t in enumerate(times)]
    interval = (e2e_m - ttft_m) / (out_m - 1) if out_m > 1 else math.nan
    return requests, MeasuredStage(k, rate, ok, failed, ttft_m, e2e_m, interval, out_m,
                                   float(obj.get("duration") or 0.0), ttft_median=ttft_med, ttft_p99=ttft_p99)


def _arrivals(count: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    """vllm bench serve's arrivals: gamma gaps (shape = burstiness, mean 1 / rate); all at 0 for "inf"."""
    if rate == math.inf:
        return np.zeros(count)
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), count)
    return np.cumsum(gaps) - gaps[0]


def _request(t: float, prompt: int, output: int, i: int, prefix_tokens: int) -> TraceRequest:
    shared = (0,) if prefix_tokens and prompt > prefix_tokens else ()
    return TraceRequest(arrival_time=t, prompt_tokens=max(1, prompt), output_tokens=max(1, output),
                        max_tokens=max(1, output), prefix_hashes=shared)


def read_vllm_bench(path: Path, seed: int = 0, prefix_tokens: int = 0) -> Benchmark:
    objects = read_objects(path)
    requests, stages, stage_ids, start = [], [], [], 0.0
    for k, obj in enumerate(objects):
        reqs, measured = stage_of(obj, k, path, seed, prefix_tokens)
        for r in reqs:
            requests.append(replace(r, arrival_time=start + r.arrival_time))
            stage_ids.append(k)
        stages.append(measured)
        start += max((r.arrival_time for r in reqs), default=0.0) + STAGE_GAP_S
    notes = ["requests as recorded (--save-detailed)" if _detailed(objects[0]) else
             f"arrivals drawn as vllm bench serve draws them (seed {seed}), mean lengths"]
    caps, note = concurrency_caps(objects, path)
    if note:
        notes.append(note)
    if prefix_tokens:
        notes.append(f"every prompt shares its first {prefix_tokens} tokens (--prefix-tokens)")
    if _detailed(objects[0]) and any(s.requests_failed for s in stages):
        notes.append("a failed request asks for its stage's mean output (its own was cut short when its client gave up)")
    return Benchmark(path.stem, str(objects[0].get("model_id") or ""), "", None, requests, stage_ids, stages,
                     prefix_block_tokens=prefix_tokens or 512, notes=notes, concurrency=caps)


def concurrency_caps(objects: list, path: Path) -> tuple:
    """(per stage its cap on requests in flight or None, note): a stage sent with `--max-concurrency N`,
    and no send times recorded, kept at most N requests in flight, each sent at its arrival time or
    when another finished, whichever was later (at `--request-rate inf`: N closed-loop users). Send
    times recorded (`--save-detailed`) are replayed as they were. (None, None) where no stage had a cap."""
    caps = [obj.get("max_concurrency") for obj in objects]
    if _detailed(objects[0]) or all(c is None for c in caps):
        return None, None
    for line, cap in enumerate(caps, 1):
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise TraceError(str(path), line, "max_concurrency", f"expected a number of requests >= 1, got {cap!r}")
    return tuple(caps), ("at most N requests in flight (" + ", ".join(f"stage {k}: {n}" for k, n in enumerate(caps) if n)
                         + "; --max-concurrency: a request goes out at its time or when another finishes), each such "
                         "stage replayed on its own from an empty server")
