"""The runs `compare` reads: one row per run directory, with what makes runs comparable.

Every run is placed on three axes read from its summary's resolved config and its Hydra
overrides: the **trace** (name plus any trace override but the load and the replicate), the
**load** (`trace.rate_scale`, as resolved from `trace.load` where a run was given one; the
fraction of capacity is kept beside it) and the **configuration** (policy plus every other
varying override). Runs that share all three and differ only in `seed` / `trace.replicate` are
replicates of one measurement (`policylab.analysis.compare_stats` pools them).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import yaml

from policylab.analysis.metric_catalog import Shown

REPLICATE_KEYS = ("seed", "trace.replicate")
LOAD_KEYS = ("trace.rate_scale", "trace.load")


# compare's columns: metrics declared in `metric_catalog`, each in the unit and precision shown
# (ranked in the catalog's direction; queueing and KV peak are shown for context, never ranked)
COLUMNS = (
    Shown("ttft", "p50", "ms", 1),
    Shown("ttft", "p99", "ms", 1),
    Shown("tpot", "p50", "ms", 2),
    Shown("tpot", "p99", "ms", 2),
    Shown("itl", "p99", "ms", 2),
    Shown("e2e", "p99", "s", 3),
    Shown("goodput", digits=3),
    Shown("slo_attainment", unit="%", digits=1),
    Shown("throughput.output_tokens_per_s", digits=1),
    Shown("preemptions", digits=0),
    Shown("queueing_delay", "p99", "s", 3, rank=False),
    Shown("kv_utilization.max", unit="%", digits=1),
    Shown("prefix_cache_hit_rate", unit="%", digits=1),
    Shown("fairness_windows.jain_mean", digits=3),              # runs of several clients
    Shown("fairness_windows.service_difference_mean", digits=0),
    Shown("cluster.load_imbalance", digits=3),                  # cluster runs only
    Shown("cluster.goodput_per_gpu", digits=3),
    Shown("kv_hierarchy.recomputed_tokens", digits=0),          # runs with a host KV tier
    Shown("kv_hierarchy.transfer_time", digits=3),
    Shown("sessions.completion_time", "p50", "s", 2),           # closed-loop sessions
    Shown("sessions.completion_time", "p99", "s", 2),
    Shown("speculative.acceptance_rate", unit="%", digits=1),   # runs with draft tokens
    Shown("speculative.tokens_per_step", digits=2),
    Shown("kv_hierarchy.host_hit_rate", unit="%", digits=1),    # runs with prefix tiers
    Shown("kv_hierarchy.disk_hit_rate", unit="%", digits=1),
    Shown("kv_hierarchy.host_transfer_time", digits=3),
    Shown("kv_hierarchy.disk_transfer_time", digits=3),
    Shown("programs.jct", "p99", "s", 3),                       # runs with tool calls
    Shown("programs.recomputed_tokens", digits=0),
    Shown("energy.per_output_token_j", digits=4),               # runs on a GPU power model
    Shown("energy.per_good_request_j", digits=1),
    Shown("energy.mean_power_w", digits=0, rank=False),
    Shown("quality.greedy_agreement", unit="%", digits=2),      # runs with a quality reference
    Shown("quality.kl_divergence", digits=5),
)
METRICS = [c.label for c in COLUMNS]
IDENTITY = ["trace", "load", "label", "policy", "params", "replicate", "status", "run_dir"]
PARTIAL = " (partial)"      # appended to a partial run's label: its own cell in every table, never ranked


class CompareError(Exception):
    """Bad input (no runs, unreadable summary): printed as one line."""


def natural_key(path) -> list:
    """`2_x` before `10_x`: Hydra job numbers sort as numbers (one line; no library needed)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def find_dirs(paths, marker: str) -> list[Path]:
    """Every directory holding `marker` at or below `paths` (W&B's copies left out), natural order."""
    found: list[Path] = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise CompareError(f"{path}: no such directory")
        below = [path] if (path / marker).is_file() else \
            sorted((p.parent for p in path.rglob(marker) if "wandb" not in p.relative_to(path).parts),
                   key=natural_key)   # W&B keeps a copy of each run's files under wandb/
        found += [p for p in below if p not in found]
    return found


def find_run_dirs(paths) -> list[Path]:
    found = find_dirs(paths, "summary.json")
    if not found:
        raise CompareError(f"{' '.join(map(str, paths))}: no run directory (one with a summary.json) in it")
    return found


def read_overrides(run_dir: Path) -> list[str]:
    path = run_dir / ".hydra" / "overrides.yaml"
    return [str(o) for o in yaml.safe_load(path.read_text()) or []] if path.exists() else []


def summary_value(summary: dict, path: tuple):
    for key in path:
        summary = summary.get(key) if isinstance(summary, dict) else None
    return summary


def read_summary(run_dir: Path) -> dict:
    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CompareError(f"{path}: unreadable ({e}): truncated or not a policylab summary") from None
    if not isinstance(summary, dict):
        raise CompareError(f"{path}: not a policylab summary (a JSON {type(summary).__name__}, not an object)")
    return summary


def read_requests_file(path: Path, read):
    """`read(path)` of a run's requests.parquet, a damaged file becoming one CompareError naming it."""
    import pyarrow as pa
    try:
        return read(path)
    except (OSError, ValueError, pa.ArrowException) as e:
        raise CompareError(f"{path}: unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__}): "
                           "truncated or not a policylab requests table") from None


def is_partial(summary: dict) -> bool:
    return bool(summary.get("partial")) or summary.get("status", "complete") != "complete"


def cost_model_label(summary: dict) -> str:
    """What timed a run's steps, in short: `roofline h100`, `profile mlp.csv@1a2b3c4d`, `real cpu (cpu timer)`."""
    c = summary.get("cost_model")
    if not isinstance(c, dict):
        return "unrecorded"
    if c.get("kind") == "real":
        return f"real {c.get('device', '?')} ({c.get('timer', '?')} timer)"
    if c.get("kind") in ("roofline", "shaped", "kernel"):
        return f"{c['kind']} {c.get('hardware', '?')}"
    return f"{c.get('kind')} {Path(str(c.get('file', '?'))).name}@{str(c.get('sha256', ''))[:8]}"


def mixed_cost_models(df: pd.DataFrame) -> list[str]:
    """A note when the runs' step times come from different cost models (their latencies differ by
    what measured them, not only by policy), else none."""
    models = df["cost_model"].unique().tolist()
    return [f"these runs mix cost models ({', '.join(models)}): their latencies were not timed the same way"] \
        if len(models) > 1 else []


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _names_a_pool_policy(override: str) -> bool:
    """`cluster.decode_policy=decode_first` and the like: the policy label says it already
    (`prefill_first+decode_first`); one with parameters (`{name:...,k:v}`) stays in the label."""
    return _key(override).endswith(("cluster.prefill_policy", "cluster.decode_policy")) and "{" not in override


def collect_runs(run_dirs) -> tuple[pd.DataFrame, list[str]]:
    """One row per run (IDENTITY columns, metric columns in shown units, `rate` in req/s and the
    global TTFT SLO), and the overrides common to all runs (left out of the labels)."""
    overrides = [read_overrides(d) for d in run_dirs]
    common = [o for o in overrides[0] if all(o in os for os in overrides)] if overrides else []
    rows = []
    for run_dir, own in zip(run_dirs, overrides):
        summary = read_summary(run_dir)
        config = summary.get("config") if isinstance(summary.get("config"), dict) else {}
        trace = config.get("trace") if isinstance(config.get("trace"), dict) else {}
        policy = summary.get("policy", "?")
        varying = [o for o in own if o not in common]
        params = [o for o in varying if _key(o) not in (*REPLICATE_KEYS, *LOAD_KEYS, "policy", "trace")
                  and not _key(o).startswith("trace.") and not _names_a_pool_policy(o)]
        trace_params = [o for o in varying if _key(o).startswith("trace.")
                        and _key(o) not in (*REPLICATE_KEYS, *LOAD_KEYS)]
        counts = summary.get("counts") or {}
        duration = summary.get("trace_duration")
        partial = is_partial(summary)
        row = {"trace": " ".join([str(trace.get("name", "?")), *trace_params]),
               "load": float(trace.get("rate_scale", 1.0)),
               "label": " ".join([policy, *params]) + (PARTIAL if partial else ""),
               "policy": policy, "params": " ".join(params), "partial": partial,
               "finished": f"{counts.get('finished', '?')}/{counts.get('requests', '?')}",
               "error": str(summary.get("error") or ""),
               "replicate": f"seed={config.get('seed', '?')} replicate={trace.get('replicate', 0)}",
               "status": summary.get("status", "?"), "run_dir": str(run_dir),
               "cost_model": cost_model_label(summary),
               "rate": counts.get("requests", 0) / duration if duration else None,
               "capacity_load": (summary.get("load") or {}).get("fraction"),
               "ttft_slo": (summary.get("slo") or {}).get("ttft")}
        for c in COLUMNS:
            value = summary_value(summary, c.path)
            row[c.label] = None if value is None else value * c.scale
        rows.append(row)
    numeric = [*METRICS, "rate", "capacity_load", "ttft_slo"]
    df = pd.DataFrame(rows, columns=[*IDENTITY, "partial", "finished", "error", "cost_model", *numeric])
    df[numeric] = df[numeric].apply(pd.to_numeric, errors="coerce")
    return df, common
