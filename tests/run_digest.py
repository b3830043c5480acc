"""The digest of a CLI run directory, shared by the replay and cluster digest tables.

`requests.parquet` is hashed exactly (every column, floats as repr): token times come from the
simulator's own arithmetic and are the same on every CPU. The summary's aggregate numbers are
hashed at 12 significant digits: numpy evaluates some reductions and transcendental functions
with CPU-specific vector code (AVX-512 or not), which moves their last bits between machines
without any change in behaviour. Twelve digits still catch any real change in a summary.
"""
from __future__ import annotations

import hashlib
import json
import math

import pandas as pd

SUMMARY_DIGITS = 12
# the config echo, the input's report, and the windowed fairness section: the latter is derived
# from requests.parquet's columns (hashed exactly above) and checked by hand-computed cases in
# tests/test_fairness_windows.py, so the digest table stays comparable across metric additions;
# likewise the energy section (a power model over the same steps: tests/test_energy.py computes
# its cases by hand and checks that a run's joules repeat exactly) and QoE (derived from the token
# times hashed above: tests/test_qoe.py computes it by hand)
NOT_DIGESTED = ("config", "trace_report", "fairness_windows", "energy", "qoe", "qoe_expected")
DERIVED_COLUMNS = ("qoe",)


def rounded(value):
    """`value` with every float rounded to SUMMARY_DIGITS significant digits (nested too)."""
    if isinstance(value, float):
        return value if not math.isfinite(value) or value == 0 else float(f"{value:.{SUMMARY_DIGITS}g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def replay_digest(run_dir) -> str:
    """requests.parquet exactly and summary.json's numbers (not the config echo, the input's
    trace_report, windowed fairness, or wall-clock fields) at SUMMARY_DIGITS."""
    requests = pd.read_parquet(run_dir / "requests.parquet")
    requests = requests.drop(columns=[c for c in DERIVED_COLUMNS if c in requests.columns])
    summary = json.loads((run_dir / "summary.json").read_text())
    h = hashlib.sha256(requests.to_csv(index=False, float_format=repr).encode())
    numbers = {k: v for k, v in summary.items() if k not in NOT_DIGESTED and "wall" not in k}
    h.update(json.dumps(rounded(numbers), sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]
