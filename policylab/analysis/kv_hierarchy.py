"""The `kv_hierarchy` section of summary.json: swap preemption's and the prefix cache's tiers'
counters, with per-tier hit rates; summed over the replicas of a cluster replay."""
from __future__ import annotations

RATE_OF = {"host_hit_rate": "host_hit_tokens", "disk_hit_rate": "disk_hit_tokens"}


def kv_hierarchy_section(result, prompt_tokens: float, hit_rate: float) -> dict | None:
    """The run's counters (a cluster's: summed over its replicas), or None when no replica has a
    host tier. With prefix tiers: `host_hit_rate` and `disk_hit_rate` are the prompt tokens
    served from that tier over the prompt tokens of the requests that started (the denominator
    of `prefix_cache_hit_rate`), and `device_hit_rate` is the rest of `prefix_cache_hit_rate`."""
    counters = _counters(result)
    if counters is None:
        return None
    if "host_hit_tokens" in counters:
        for rate, tokens in RATE_OF.items():
            counters[rate] = counters[tokens] / prompt_tokens if prompt_tokens > 0 else None
        counters["device_hit_rate"] = hit_rate - counters["host_hit_rate"] - counters["disk_hit_rate"] \
            if prompt_tokens > 0 else None
    return counters


def _counters(result) -> dict | None:
    own = result.sections.get("kv_tiers")
    if own:
        return dict(own)
    parts = [p.result.sections["kv_tiers"] for p in getattr(result, "replicas", ()) if "kv_tiers" in p.result.sections]
    if not parts:
        return None
    total: dict = {}
    for part in parts:
        for k, v in part.items():
            total[k] = total.get(k, 0) + v
    return total


def replica_kv_hierarchy(part) -> dict:
    """A replica's own counters, as a `kv_hierarchy` entry of its cluster.replicas row (none: {})."""
    own = part.result.sections.get("kv_tiers")
    return {"kv_hierarchy": dict(own)} if own else {}
