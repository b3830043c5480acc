"""Trace transforms from TraceConfig, applied once after reading, in this order:
sort → rebase to the first request → time window → sampling → first N → repeat → replicate → rate scale →
client assignment → SLO classes → length clipping. Every request dropped or changed is counted
in the TraceReport so the run summary can say so.
"""
from __future__ import annotations

from collections.abc import Mapping

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from policylab.core.request import MAX_ARRIVAL_S
from policylab.core.request import TraceRequest
from policylab.traces.errors import TraceError
from policylab.traces.replicate import physical_memory, resample, tile
from policylab.traces.tool_calls import add_tool_calls, check_transform as check_tool_transform, clip_tool_calls

CLIENT_ASSIGNMENTS = ("keep", "column", "round_robin", "zipf")


@dataclass
class TraceReport:
    """What loading did to a trace: read, skipped (by reason), dropped and clipped counts."""
    file: str
    format: str
    read: int = 0
    skipped: Counter = field(default_factory=Counter)
    out_of_window: int = 0
    sampled_out: int = 0
    over_max_requests: int = 0
    clipped_prompts: int = 0
    clipped_outputs: int = 0
    kept: int = 0

    def as_dict(self) -> dict:
        """JSON-ready counts for summary.json: rows skipped by reason, requests dropped or clipped."""
        return {"file": self.file, "format": self.format, "read": self.read, "kept": self.kept,
                "skipped": dict(sorted(self.skipped.items())), "out_of_window": self.out_of_window,
                "sampled_out": self.sampled_out, "over_max_requests": self.over_max_requests,
                "clipped_prompts": self.clipped_prompts, "clipped_outputs": self.clipped_outputs}

    def summary(self) -> str:
        parts = [f"{self.kept} requests from {self.file} ({self.format}, {self.read} read)"]
        parts += [f"skipped {n}: {why}" for why, n in sorted(self.skipped.items())]
        for label, n in (("outside the time window", self.out_of_window), ("sampled out", self.sampled_out),
                         ("beyond max_requests", self.over_max_requests),
                         ("prompts clipped", self.clipped_prompts), ("outputs clipped", self.clipped_outputs)):
            if n:
                parts.append(f"{label}: {n}")
        return "; ".join(parts)


def _bad(field_name: str, message: str) -> TraceError:
    return TraceError("trace config", None, f"trace.{field_name}", message)


def check_config(cfg) -> None:
    """Reject transform settings that make no sense before reading a byte."""
    if not cfg.rate_scale > 0:
        raise _bad("rate_scale", f"must be > 0, got {cfg.rate_scale}")
    if cfg.max_requests is not None and cfg.max_requests < 1:
        raise _bad("max_requests", f"must be >= 1 or null, got {cfg.max_requests}")
    if cfg.client_timeout is not None and (isinstance(cfg.client_timeout, bool) or
                                           not isinstance(cfg.client_timeout, (int, float)) or
                                           not 0 < cfg.client_timeout <= MAX_ARRIVAL_S):
        raise _bad("client_timeout", f"must be a number of seconds in (0, {MAX_ARRIVAL_S:g}] or null, "
                   f"got {cfg.client_timeout!r}")
    if cfg.start_time is not None and cfg.end_time is not None and cfg.end_time <= cfg.start_time:
        raise _bad("end_time", f"must be after start_time ({cfg.start_time}), got {cfg.end_time}")
    for name in ("max_prompt_tokens", "max_output_tokens"):
        if getattr(cfg, name) is not None and getattr(cfg, name) < 1:
            raise _bad(name, f"must be >= 1 or null, got {getattr(cfg, name)}")
    if cfg.sample_fraction is not None and not 0 < cfg.sample_fraction <= 1:
        raise _bad("sample_fraction", f"must be in (0, 1], got {cfg.sample_fraction}")
    if cfg.client_assignment not in CLIENT_ASSIGNMENTS:
        raise _bad("client_assignment", f"must be one of {CLIENT_ASSIGNMENTS}, got '{cfg.client_assignment}'")
    if cfg.client_assignment == "column" and not cfg.client_column:
        raise _bad("client_column", "client_assignment=column needs the column name in trace.client_column")
    if cfg.repeat < 1:
        raise _bad("repeat", f"must be >= 1, got {cfg.repeat}")
    if cfg.replicate < 0:
        raise _bad("replicate", f"must be >= 0 (0: the trace as read), got {cfg.replicate}")
    if cfg.num_clients < 1:
        raise _bad("num_clients", f"must be >= 1, got {cfg.num_clients}")
    if cfg.prefix_block_tokens < 1:
        raise _bad("prefix_block_tokens", f"must be >= 1, got {cfg.prefix_block_tokens}")
    if not (isinstance(cfg.zipf_exponent, (int, float)) and 0 <= cfg.zipf_exponent < math.inf):
        raise _bad("zipf_exponent", f"must be a finite number >= 0, got {cfg.zipf_exponent!r}")
    _slo_table(cfg)
    if cfg.tool_calls:
        check_tool_transform(dict(cfg.tool_calls))
    for cls, weight in cfg.slo_ratio.items():
        _number(weight, f"slo_ratio.{cls}", "a weight", zero_allowed=True)
    if cfg.slo_by_client and cfg.slo_ratio:
        raise _bad("slo_ratio", "set slo_by_client or slo_ratio, not both")
    for source in ("slo_by_client", "slo_ratio"):
        names = getattr(cfg, source).values() if source == "slo_by_client" else getattr(cfg, source).keys()
        for cls in names:
            if cls not in cfg.slo_classes:
                raise _bad(source, f"SLO class '{cls}' is not in trace.slo_classes {list(cfg.slo_classes)}")


def _number(value, key: str, what: str, zero_allowed: bool = False) -> float:
    """`value` as a finite float > 0 (>= 0 when `zero_allowed`), else an error naming trace.KEY."""
    try:
        number = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not ((0 <= number if zero_allowed else 0 < number) and number < math.inf):
        raise _bad(key, f"must be {what}, a finite number {'>= 0' if zero_allowed else '> 0'}; got {value!r}")
    return number


def _slo_table(cfg) -> dict:
    table = {}
    for cls, spec in cfg.slo_classes.items():
        if isinstance(spec, Mapping):          # (a plain dict, or the composed config's mapping)
            spec = dict(spec)
        if not isinstance(spec, dict):
            raise _bad(f"slo_classes.{cls}", f"takes ttft_slo and tpot_slo, got {spec!r}")
        unknown = set(spec) - {"ttft_slo", "tpot_slo"}
        if unknown:
            raise _bad(f"slo_classes.{cls}", f"takes ttft_slo and tpot_slo, got {sorted(unknown)}")
        table[cls] = {k: (None if spec.get(k) is None else _number(spec[k], f"slo_classes.{cls}.{k}", "seconds"))
                      for k in ("ttft_slo", "tpot_slo")}
    return table


def _clients(reqs: list, cfg, rng: np.random.Generator) -> list:
    if cfg.client_assignment == "round_robin":
        return [f"client-{i % cfg.num_clients}" for i in range(len(reqs))]
    if cfg.client_assignment == "zipf":
        weights = 1.0 / np.arange(1, cfg.num_clients + 1) ** cfg.zipf_exponent
        picks = rng.choice(cfg.num_clients, size=len(reqs), p=weights / weights.sum())
        return [f"client-{k}" for k in picks]
    return [r.client for r in reqs]


def _slo_classes(clients: list, cfg, rng: np.random.Generator) -> list:
    """SLO class per request (None: keep the trace's own SLOs)."""
    if cfg.slo_by_client:
        return [cfg.slo_by_client.get(c) for c in clients]
    if cfg.slo_ratio:
        names = list(cfg.slo_ratio)
        weights = np.array([float(cfg.slo_ratio[n]) for n in names])
        if (weights < 0).any() or weights.sum() <= 0:
            raise _bad("slo_ratio", f"weights must be >= 0 with a positive sum, got {dict(cfg.slo_ratio)}")
        return [names[k] for k in rng.choice(len(names), size=len(clients), p=weights / weights.sum())]
    return [None] * len(clients)


BYTES_PER_REQUEST = 2600      # what a replay holds per trace request (a million: 2.45 GiB)


def check_repeat_fits(requests: int, repeat: int) -> None:
    """`trace.repeat` tiles the trace: refuse, by arithmetic, a tiling this machine cannot hold."""
    memory, need = physical_memory(), requests * repeat * BYTES_PER_REQUEST
    if memory and need > memory:
        raise _bad("repeat", f"{requests:,} requests x {repeat:,} = {requests * repeat:,} requests, about "
                             f"{need / 2**30:,.0f} GiB to replay; this machine has {memory / 2**30:,.0f} GiB")


def apply_transforms(reqs: list, cfg, seed: int, report: TraceReport) -> list:
    """TraceRequests from RawRequests (absolute times, any order); cfg passed check_config."""
    report.read = len(reqs)
    reqs = sorted(reqs, key=lambda r: r.arrival_time)
    origin = reqs[0].arrival_time if reqs else 0.0
    times = [r.arrival_time - origin for r in reqs]
    if cfg.start_time is not None or cfg.end_time is not None:
        lo = -math.inf if cfg.start_time is None else cfg.start_time
        hi = math.inf if cfg.end_time is None else cfg.end_time
        keep = [i for i, t in enumerate(times) if lo <= t < hi]
        report.out_of_window = len(reqs) - len(keep)
        reqs, times = [reqs[i] for i in keep], [times[i] - max(lo, 0.0) for i in keep]
    if cfg.sample_fraction is not None and cfg.sample_fraction < 1:
        mask = np.random.default_rng([seed, 1]).random(len(reqs)) < cfg.sample_fraction
        report.sampled_out = int((~mask).sum())
        reqs, times = [r for r, m in zip(reqs, mask) if m], [t for t, m in zip(times, mask) if m]
    if cfg.max_requests is not None and len(reqs) > cfg.max_requests:
        report.over_max_requests = len(reqs) - cfg.max_requests
        reqs, times = reqs[:cfg.max_requests], times[:cfg.max_requests]
    check_repeat_fits(len(reqs), cfg.repeat)
    reqs, times = resample(*tile(reqs, times, cfg.repeat), cfg.replicate, seed)
    base = times[0] if times and cfg.start_time is None else 0.0
    clients = _clients(reqs, cfg, np.random.default_rng([seed, 2]))
    classes, slo = _slo_classes(clients, cfg, np.random.default_rng([seed, 3])), _slo_table(cfg)
    out = []
    for r, t, client, cls in zip(reqs, times, clients, classes):
        prompt, output, hashes = r.prompt_tokens, r.output_tokens, r.prefix_hashes
        ttft, tpot = (r.ttft_slo, r.tpot_slo) if cls is None else (slo[cls]["ttft_slo"], slo[cls]["tpot_slo"])
        if cfg.max_prompt_tokens is not None and prompt > cfg.max_prompt_tokens:
            report.clipped_prompts += 1
            prompt, hashes = cfg.max_prompt_tokens, hashes[:math.ceil(cfg.max_prompt_tokens / cfg.prefix_block_tokens)]
        if cfg.max_output_tokens is not None and output > cfg.max_output_tokens:
            report.clipped_outputs += 1
            output = cfg.max_output_tokens
        out.append(TraceRequest((t - base) / cfg.rate_scale, prompt, output, client, r.priority, ttft, tpot,
                                hashes, r.max_tokens, r.spec_acceptance, n=r.n,
                                fork_output_tokens=r.fork_output_tokens, beam_width=r.beam_width,
                                tool_calls=clip_tool_calls(r.tool_calls, output) if r.tool_calls else ()))
    if cfg.tool_calls:
        calls = add_tool_calls([t.output_tokens for t in out], dict(cfg.tool_calls), np.random.default_rng([seed, 5]))
        out = [t if t.tool_calls else dataclasses.replace(t, tool_calls=c) for t, c in zip(out, calls)]
    report.kept = len(out)
    return out
