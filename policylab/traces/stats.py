"""Summary statistics of a trace, as `trace inspect` prints them."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass
class TraceStats:
    requests: int
    duration: float                 # s, first to last arrival
    mean_rate: float                # requests / duration (nan when duration is 0)
    interarrival_cv: float          # std / mean of the gaps: 1 for Poisson, > 1 bursty
    prompt: dict                    # mean, p50, p90, p99, max
    output: dict
    prefix_blocks: int              # prompt blocks of prefix_block_tokens tokens
    prefix_hits: int                # of those, blocks whose hash appeared in an earlier request
    clients: Counter = field(default_factory=Counter)
    slo_classes: Counter = field(default_factory=Counter)   # (ttft_slo, tpot_slo) -> requests

    @property
    def prefix_share(self) -> float:
        return self.prefix_hits / self.prefix_blocks if self.prefix_blocks else 0.0


def _summary(values) -> dict:
    a = np.asarray(values, dtype=float)
    out = {"mean": float(a.mean())}
    out.update({f"p{q}": float(np.percentile(a, q)) for q in PERCENTILES})
    out["max"] = float(a.max())
    return out


def trace_stats(reqs: list, prefix_block_tokens: int = 512) -> TraceStats:
    """Statistics of a non-empty list of TraceRequests in arrival order."""
    times = np.array([r.arrival_time for r in reqs])
    duration = float(times[-1] - times[0])
    gaps = np.diff(times)
    cv = float(gaps.std() / gaps.mean()) if len(gaps) and gaps.mean() > 0 else math.nan
    seen, hits, blocks = set(), 0, 0
    for r in reqs:
        blocks += max(len(r.prefix_hashes), math.ceil(r.prompt_tokens / prefix_block_tokens))
        for h in r.prefix_hashes:
            hits += h in seen
            seen.add(h)
    return TraceStats(
        requests=len(reqs), duration=duration,
        mean_rate=len(reqs) / duration if duration > 0 else math.nan, interarrival_cv=cv,
        prompt=_summary([r.prompt_tokens for r in reqs]), output=_summary([r.output_tokens for r in reqs]),
        prefix_blocks=blocks, prefix_hits=hits, clients=Counter(r.client for r in reqs),
        slo_classes=Counter((r.ttft_slo, r.tpot_slo) for r in reqs))


def format_stats(s: TraceStats, prefix_block_tokens: int = 512) -> str:
    def row(label, d):
        cells = "  ".join(f"{k} {d[k]:>8.1f}" for k in ("mean", "p50", "p90", "p99", "max"))
        return f"{label:<16}{cells}"

    lines = [f"requests        {s.requests}",
             f"duration        {s.duration:.2f} s",
             f"mean rate       {s.mean_rate:.3f} req/s",
             f"inter-arrival CV {s.interarrival_cv:.3f}   (1 = Poisson, > 1 = bursty)",
             row("prompt tokens", s.prompt),
             row("output tokens", s.output),
             f"prefix sharing  {s.prefix_share:.3f}   ({s.prefix_hits} of {s.prefix_blocks} prompt blocks "
             f"of {prefix_block_tokens} tokens have a hash seen earlier)",
             f"clients         {len(s.clients)}"]
    lines += [f"  {name:<22}{n:>8}  ({n / s.requests:.1%})" for name, n in s.clients.most_common(20)]
    if len(s.clients) > 20:
        lines.append(f"  ... and {len(s.clients) - 20} more")
    if any(k != (None, None) for k in s.slo_classes):
        lines.append("SLO classes (ttft_slo s, tpot_slo s)")
        lines += [f"  {str(k):<22}{n:>8}" for k, n in s.slo_classes.most_common(10)]
    return "\n".join(lines)
