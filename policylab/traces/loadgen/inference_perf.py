"""Kubernetes inference-perf report folders read as a Benchmark.

A run of inference-perf (github.com/kubernetes-sigs/inference-perf) writes a report folder:

- `config.yaml`: the run's configuration. `load.stages` (each `rate` req/s for `duration` s;
  `load.type` constant or poisson: both draw exponential gaps, `constant` rescales them to fill
  the stage; `load.type` concurrent: `num_requests` with `concurrency_level` in flight, replayed
  as closed-loop users; with `load.sweep` the stages are generated at run time and config.yaml keeps
  none: the stage reports' requested rates, `sweep.stage_duration` each), `load.num_workers` x
  `load.worker_max_concurrency` (the requests in flight
  at most: each worker holds a slot from taking a request until it ends; a report's config.yaml
  records both), `load.interval` (seconds between stages), `data.type` and, for `shared_prefix`,
  `data.shared_prefix` (`num_groups` / `num_unique_system_prompts`, `num_prompts_per_group` /
  `num_users_per_system_prompt`, `system_prompt_len`, `question_len`, `output_len`),
  `server.model_name`, `server.ignore_eos`, `load.request_timeout` (seconds after which a client gives
  up on a request; unset, aiohttp's default of 300 s applies);
- `stage_N_lifecycle_metrics.json`: per stage, `load_summary` (`count`, `requested_rate`,
  `send_duration`), `successes` (`count`, `latency.{request_latency,time_to_first_token}.mean`,
  `prompt_len.mean`, `output_len.mean`) and `failures.count`;
- `per_request_lifecycle_metrics.json` (when `report.request_lifecycle.per_request`): every
  request's `start_time`, `end_time`, `request` (the payload, with its prompt), `info` (input and
  output token counts) and `error`.

With the per-request file the trace has the requests as they were sent: start times, token counts,
and prefix sharing from the prompts themselves (identical prompts share every block; prompts of
a shared-prefix group share their system prompt). Without it, the workload is rebuilt from
config.yaml as inference-perf generates it (policylab.traces.shared_prefix), with the stages'
measured mean prompt length.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from policylab.core.request import TraceRequest
from policylab.traces.errors import TraceError
from policylab.traces.loadgen.benchmark import Benchmark, MeasuredStage
from policylab.traces.shared_prefix import SharedPrefixWorkload, Stage, shared_prefix_trace

STAGE_GAP_S = 60.0        # idle seconds between rebuilt stages (each starts on an idle server)
# inference-perf hands `load.request_timeout` to its aiohttp session as the total timeout of a request;
# unset, the session keeps aiohttp's default total timeout: 5 minutes (aiohttp.client.DEFAULT_TIMEOUT)
AIOHTTP_DEFAULT_TIMEOUT_S = 300.0
GROUP_KEY_CHARS = 64      # prompts of one shared-prefix group begin with the same system prompt text
LATE_SEND_S = 0.1         # a stage whose requests went out later than this on average: said in the notes


def is_report_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.yaml").is_file() and any(path.glob("stage_*_lifecycle_metrics.json"))


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceError(str(path), None, None, f"not a readable JSON file ({e})") from None


def _number(value, path: Path, field: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise TraceError(str(path), None, field, f"expected a number, got {value!r}") from None
    if not math.isfinite(x) or x < 0:
        raise TraceError(str(path), None, field, f"expected a finite number >= 0, got {value!r}")
    return x


def _mean(section: dict, key: str, path: Path, field: str) -> float:
    node = section.get(key)
    if not isinstance(node, dict) or "mean" not in node:
        raise TraceError(str(path), None, field, f"no '{key}.mean' (a stage with successful streamed requests has it)")
    return _number(node["mean"], path, f"{field}.mean")


def read_config(folder: Path) -> dict:
    path = folder / "config.yaml"
    try:
        cfg = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise TraceError(str(path), None, None, f"not a readable YAML file ({e})") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("load"), dict):
        raise TraceError(str(path), None, "load", "an inference-perf config.yaml has a 'load' section")
    stages = cfg["load"].get("stages")
    if isinstance(cfg["load"].get("sweep"), dict) and not stages:
        return cfg                       # (stages generated at run time: swept_stages)
    if not isinstance(stages, list) or not stages:
        raise TraceError(str(path), None, "load.stages", "expected a list of {rate, duration} stages")
    return cfg


def swept_stages(cfg: dict, stages: list, path: Path) -> dict:
    """config.yaml with the stages a `load.sweep` generated at run time (config.yaml keeps none): each
    reported stage's requested rate for `sweep.stage_duration` s. The sweep's first burst (its
    `num_requests` in 5 s, to find the saturation rate) is in no stage's report, nor replayed."""
    duration = _positive(cfg["load"]["sweep"].get("stage_duration", 180), path, "load.sweep.stage_duration")
    load = dict(cfg["load"], stages=[{"rate": s.rate, "duration": duration} for s in stages])
    return dict(cfg, load=load)


def _positive(value, path: Path, field: str, expected: str = "a number > 0") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise TraceError(str(path), None, field, f"expected {expected}, got {value!r}")
    return float(value)


def request_timeout(cfg: dict, path: Path) -> tuple[float, str]:
    """(seconds, where from) after which inference-perf's clients give up on a request."""
    value = cfg["load"].get("request_timeout")
    if value is None:
        return AIOHTTP_DEFAULT_TIMEOUT_S, "load.request_timeout unset: aiohttp's default total timeout"
    return _positive(value, path, "load.request_timeout", "seconds > 0 or null"), "load.request_timeout"


def load_type(cfg: dict) -> str:
    return str(cfg["load"].get("type", "constant"))


def measured_stages(folder: Path, all_at_once: bool = False) -> list:
    """The stages as the client measured them; `all_at_once` (load.type concurrent): their requests
    were all sent at once, at most the concurrency level in flight (the report gives num_requests a
    second as their rate)."""
    out = []
    files = sorted(folder.glob("stage_*_lifecycle_metrics.json"), key=lambda p: int(p.stem.split("_")[1]))
    for path in files:
        k = int(path.stem.split("_")[1])
        data = _json(path)
        ok, failed = data.get("successes") or {}, data.get("failures") or {}
        load = data.get("load_summary") or {}
        n_ok = int(_number(ok.get("count", 0), path, "successes.count"))
        n_failed = int(_number(failed.get("count", 0), path, "failures.count"))
        if n_ok == 0:
            out.append(MeasuredStage(k, math.inf if all_at_once else float(load.get("requested_rate") or math.nan),
                                     0, n_failed, math.nan, math.nan, math.nan))
            continue
        latency = ok.get("latency") or {}
        ttft = _mean(latency, "time_to_first_token", path, "successes.latency.time_to_first_token")
        e2e = _mean(latency, "request_latency", path, "successes.latency.request_latency")
        out_len = _mean(ok, "output_len", path, "successes.output_len")
        interval = (e2e - ttft) / (out_len - 1) if out_len > 1 else math.nan
        rate = load.get("requested_rate")          # (none for a concurrent stage of some versions)
        delay = load.get("schedule_delay")
        spread = latency.get("time_to_first_token")
        spread = spread if isinstance(spread, dict) else {}
        median, p99 = (_number(spread[q], path, f"successes.latency.time_to_first_token.{q}")
                       if spread.get(q) is not None else math.nan for q in ("median", "p99"))
        out.append(MeasuredStage(k, math.inf if rate is None or all_at_once else
                                 _number(rate, path, "load_summary.requested_rate"),
                                 n_ok, n_failed, ttft, e2e, interval, out_len,
                                 float(load.get("send_duration") or 0.0),
                                 float(delay.get("mean") or 0.0) if isinstance(delay, dict) else 0.0,
                                 ttft_median=median, ttft_p99=p99))
    if not out:
        raise TraceError(str(folder), None, None, "no stage_N_lifecycle_metrics.json in the report folder")
    return out


def _prompt_mean(folder: Path, stage: int) -> float | None:
    data = _json(folder / f"stage_{stage}_lifecycle_metrics.json")
    node = (data.get("successes") or {}).get("prompt_len")
    return float(node["mean"]) if isinstance(node, dict) and node.get("mean") else None


def _shared_prefix(cfg: dict, path: Path) -> dict:
    data = cfg.get("data") or {}
    if data.get("type") != "shared_prefix":
        raise TraceError(str(path), None, "data.type", f"'{data.get('type')}' cannot be rebuilt without the per-request "
                         "report (report.request_lifecycle.per_request: true); shared_prefix can")
    sp = data.get("shared_prefix") or {}
    for key, what in (("question_distribution", "question lengths drawn from a distribution"),
                      ("output_distribution", "output lengths drawn from a distribution"),
                      ("enable_multi_turn_chat", "multi-turn chats (each turn's prompt the conversation so far)")):
        if sp.get(key):
            raise TraceError(str(path), None, f"data.shared_prefix.{key}", f"{what} cannot be rebuilt without the "
                             "per-request report (report.request_lifecycle.per_request: true)")
    groups = sp.get("num_groups", sp.get("num_unique_system_prompts"))
    per_group = sp.get("num_prompts_per_group", sp.get("num_users_per_system_prompt"))
    out = {}
    for name, value in (("num_groups", groups), ("num_prompts_per_group", per_group),
                        ("system_prompt_len", sp.get("system_prompt_len")), ("question_len", sp.get("question_len")),
                        ("output_len", sp.get("output_len"))):
        if not isinstance(value, (int, float)) or value < 1:
            raise TraceError(str(path), None, f"data.shared_prefix.{name}",
                             f"expected a number >= 1 (a fixed length; distributions need the per-request report), got {value!r}")
        out[name] = int(value)
    return out


def rebuilt_requests(folder: Path, cfg: dict, stages: list, seed: int) -> tuple[list, list, int, tuple | None]:
    """The workload as inference-perf generates it from config.yaml (no per-request report), and per
    stage its cap on requests in flight (`load_plan`)."""
    sp = _shared_prefix(cfg, folder / "config.yaml")
    n = sp["num_groups"] * sp["num_prompts_per_group"]
    system = sp["system_prompt_len"] + 1                             # + BOS
    measured = [m for m in (_prompt_mean(folder, s.stage) for s in stages) if m]
    prompt = int(round(sum(measured) / len(measured))) if measured else system - 1 + sp["question_len"] + 1
    load = SharedPrefixWorkload(sp["num_groups"], sp["num_prompts_per_group"], system,
                                [max(prompt, system + 1)] * n, [sp["output_len"]] * n)
    plan, caps = load_plan(cfg, folder / "config.yaml")
    requests, stage_of = shared_prefix_trace(load, plan, STAGE_GAP_S, seed)
    return requests, stage_of, system, caps


def _stage_field(stage, key: str, path: Path, k: int) -> float:
    return _positive(stage.get(key) if isinstance(stage, dict) else None, path, f"load.stages[{k}].{key}")


def _stage_count(stage, key: str, path: Path, k: int) -> int:
    return _count(stage.get(key) if isinstance(stage, dict) else None, path, f"load.stages[{k}].{key}", "requests")


def _count(value, path: Path, field: str, what: str) -> int:
    """A whole number >= 1 of `what` (workers, requests), or a TraceError naming the field."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
        raise TraceError(str(path), None, field, f"expected a number of {what} >= 1, got {value!r}")
    return int(value)


def inflight_cap(cfg: dict, path: Path) -> int | None:
    """inference-perf's cap on requests in flight, where config.yaml records it (a report's config.yaml
    has every field): `load.num_workers` processes, each holding at most `load.worker_max_concurrency`
    requests, sent or waiting for their time; None where either is unset (`num_workers` defaults to
    the client machine's CPU count)."""
    load = cfg["load"]
    workers, each = load.get("num_workers"), load.get("worker_max_concurrency")
    if workers is None or each is None:
        return None
    return _count(workers, path, "load.num_workers", "workers") * _count(
        each, path, "load.worker_max_concurrency", "requests")


def load_plan(cfg: dict, path: Path) -> tuple[list, tuple | None]:
    """(the stages as sent, per stage its cap on requests in flight or None; None: no stage has one)
    from config.yaml's `load`: `constant` and `poisson` stages send `rate` req/s for `duration` s,
    each request at its time or, with the workers' slots all held (`inflight_cap`), when another
    finishes (a stage sending no more requests than the cap has None); `concurrent` stages send
    `num_requests` with `concurrency_level` in flight (that many closed-loop users)."""
    kind = load_type(cfg)
    stages = cfg["load"]["stages"]
    if kind in ("constant", "poisson"):
        plan = [Stage(_stage_field(s, "rate", path, k), _stage_field(s, "duration", path, k))
                for k, s in enumerate(stages)]
        cap = inflight_cap(cfg, path)
        caps = tuple(cap if cap is not None and int(s.rate * s.duration) > cap else None for s in plan)
        return plan, caps if any(caps) else None
    if kind != "concurrent":
        raise TraceError(str(path), None, "load.type", f"'{kind}' cannot be rebuilt without the per-request report "
                         "(report.request_lifecycle.per_request: true); constant, poisson and concurrent can")
    counts = [_stage_count(s, "num_requests", path, k) for k, s in enumerate(stages)]
    levels = tuple(_stage_count(s, "concurrency_level", path, k) for k, s in enumerate(stages))
    return [Stage(n, 1.0, arrivals=(0.0,) * n) for n in counts], levels


def _prompt_text(payload: dict) -> str:
    return str(payload.get("prompt") or payload.get("messages") or "")


def recorded_requests(folder: Path, stages: list, prefix_tokens: int) -> tuple[list, list, int, int]:
    """(the requests as sent (per_request_lifecycle_metrics.json), in send order, split into the stages
    by the stages' request counts, their stages, the prefix's tokens, how many failed requests' prompt
    lengths were filled in); prompts with the same text share all their blocks, prompts that begin with
    the same text (a group's system prompt) share the first `prefix_tokens`. inference-perf counts no
    input tokens for a request that failed: it gets the count of the same prompt answered in the run
    (a workload sends its prompts in a cycle), else the answered requests' mean."""
    path = folder / "per_request_lifecycle_metrics.json"
    rows = _json(path)
    if not isinstance(rows, list) or not rows:
        raise TraceError(str(path), None, None, "expected a non-empty list of requests")
    rows = sorted(rows, key=lambda r: float(r.get("start_time", 0.0)))
    counts = [s.requests_ok + s.requests_failed for s in stages]
    if sum(counts) != len(rows):
        raise TraceError(str(path), None, None, f"{len(rows)} requests, but the stage reports count {sum(counts)}")
    t0 = float(rows[0]["start_time"])
    payloads = [_payload(row.get("request")) for row in rows]
    known: dict = {}                      # prompt text -> its input tokens, where counted
    for row, payload in zip(rows, payloads):
        if n := _input_tokens(row.get("info") or {}):
            known.setdefault(_prompt_text(payload), n)
    typical = round(sum(known.values()) / len(known)) if known else 0
    prompts, groups, requests, stage_of, filled = {}, {}, [], [], 0
    for i, (row, payload) in enumerate(zip(rows, payloads), 1):
        info, text, failed = row.get("info") or {}, _prompt_text(payload), bool(row.get("error"))
        prompt_len = _input_tokens(info)
        if not prompt_len and failed:
            prompt_len, filled = known.get(text, typical), filled + 1
        out_len = _output_tokens(info, payload, failed=failed)
        if not prompt_len or not out_len:
            raise TraceError(str(path), i, "info", "a request without its input and output token counts")
        p = prompts.setdefault(text, len(prompts))
        g = groups.setdefault(text[:GROUP_KEY_CHARS], len(groups))
        own = -(-(prompt_len - prefix_tokens) // prefix_tokens) if prompt_len > prefix_tokens else 0
        hashes = (g,) + tuple((1 << 40) + p * (1 << 16) + j for j in range(own))
        requests.append(TraceRequest(arrival_time=float(row["start_time"]) - t0, prompt_tokens=int(prompt_len),
                                     output_tokens=int(out_len), max_tokens=int(out_len), prefix_hashes=hashes))
    for stage, count in zip(stages, counts):
        stage_of += [stage.stage] * count
    return requests, stage_of, prefix_tokens, filled


def _payload(value) -> dict:
    if isinstance(value, dict):
        return value
    try:
        data = json.loads(value) if isinstance(value, str) else {}
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _input_tokens(info: dict) -> int:
    text = ((info.get("request_metrics") or {}).get("text") or {})
    return int(info.get("input_tokens") or text.get("input_tokens") or 0)


def _output_tokens(info: dict, payload: dict, failed: bool = False) -> int:
    """The tokens a request asked for: a failed one's counts stop where its client gave up, so its
    payload's max_tokens (ignore_eos: all of them) comes first."""
    response = info.get("response_metrics") or {}
    received = info.get("output_tokens") or response.get("output_tokens")
    if failed:
        return int(payload.get("max_tokens") or received or 0)
    return int(received or payload.get("max_tokens") or 0)


def _sending(cfg: dict, stages: list, caps: tuple | None) -> str:
    """How the rebuilt stages send their requests, as the notes say it."""
    if load_type(cfg) == "concurrent":
        return (f"closed-loop users ({', '.join(map(str, caps))} by stage: load.type concurrent), each stage "
                "replayed on its own from an empty server")
    if not caps:
        return "arrivals drawn as inference-perf draws them"
    capped = ", ".join(str(s.stage) for s, cap in zip(stages, caps) if cap)
    return (f"arrivals drawn as inference-perf draws them, at most {max(c for c in caps if c)} in flight in stage(s) "
            f"{capped} (load.num_workers x load.worker_max_concurrency: a request goes out at its time or when "
            "another finishes), each stage replayed on its own from an empty server")


def read_inference_perf(folder: Path, seed: int = 0) -> Benchmark:
    """The report folder as a Benchmark (the server's knobs are not in the report: the caller sets them)."""
    cfg = read_config(folder)
    stages = measured_stages(folder, all_at_once=load_type(cfg) == "concurrent")
    swept = not cfg["load"].get("stages")
    if swept:
        cfg = swept_stages(cfg, stages, folder / "config.yaml")
    if len(stages) != len(cfg["load"]["stages"]):
        raise TraceError(str(folder), None, "load.stages", f"config.yaml has {len(cfg['load']['stages'])} stages "
                         f"but the folder reports {len(stages)}")
    notes = [f"stages generated by load.sweep at {', '.join(f'{s.rate:g}' for s in stages)} req/s; its first burst, "
             "which warmed the server's prefix cache, is in no report and not replayed"] if swept else []
    sp = (cfg.get("data") or {}).get("shared_prefix") or {}
    prefix = int(sp.get("system_prompt_len", 0) or 0) + 1 if sp else 512
    if (folder / "per_request_lifecycle_metrics.json").is_file():         # (sent when they were: open loop)
        requests, stage_of, prefix, filled = recorded_requests(folder, stages, prefix)
        caps = None
        notes.append("requests as recorded (per_request_lifecycle_metrics.json)" + (
            f"; {filled} failed request(s) without their prompt's token count (inference-perf counts none "
            "for a failed request): the count of the same prompt answered, else the answered ones' mean"
            if filled else ""))
    else:
        requests, stage_of, prefix, caps = rebuilt_requests(folder, cfg, stages, seed)
        notes.append(f"workload rebuilt from config.yaml (seed {seed}): {_sending(cfg, stages, caps)}, prompt "
                     "lengths the stages' mean")
        late = [s for k, s in enumerate(stages) if s.schedule_delay > LATE_SEND_S and not (caps and caps[k])]
        if late:
            capped = "" if inflight_cap(cfg, folder / "config.yaml") else " or was at its concurrency cap"
            notes.append("requests went out late (" + ", ".join(f"stage {s.stage}: {s.schedule_delay:.2g} s" for s in late)
                         + f" on average; the load generator fell behind{capped}): the rebuilt arrivals, at their "
                         "scheduled times, load the server more than it was; the per-request report has the send times")
    timeout, source = request_timeout(cfg, folder / "config.yaml")
    if any(s.requests_failed for s in stages):
        notes.append(f"its clients gave up after {timeout:g} s ({source})")
        retries = cfg["load"].get("request_retries")
        if isinstance(retries, int) and retries > 0:
            notes.append(f"its clients sent a failed request again up to {retries} times (load.request_retries); "
                         "the replay's give up once")
    server = cfg.get("server") or {}
    return Benchmark(folder.name, str(server.get("model_name") or ""), "", None, requests, stage_of, stages,
                     prefix_block_tokens=max(1, prefix), notes=notes, client_timeout=timeout, concurrency=caps)
