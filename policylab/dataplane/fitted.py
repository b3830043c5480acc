"""The fitted cost model of the sim data plane: step time as a non-negative linear function
of batch features, fitted on the real plane by `python -m policylab calibrate`.

It lives beside the sim that reads it (`dataplane.calibration=FILE`); the app that measures
and fits it (`policylab.apps.calibrate`) imports it from here, never the other way round.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FEATURES = ("const", "tokens", "prefill_attn", "decode_seqs", "decode_kv", "sampled")


def batch_features(q: np.ndarray, ctx: np.ndarray) -> np.ndarray:
    """Feature vector of one batch given per-request query and context lengths."""
    decode = (q == 1) & (ctx > 0)
    prefill = ~decode
    return np.array([
        1.0,
        q.sum(),
        float(np.dot(q[prefill], ctx[prefill] + (q[prefill] + 1) / 2)) / 1e3,
        decode.sum(),
        ctx[decode].sum() / 1e3,
        float(len(q)),
    ])


@dataclass
class Calibration:
    weights: np.ndarray     # seconds per unit of each feature
    meta: dict

    def predict(self, q: np.ndarray, ctx: np.ndarray) -> float:
        return float(batch_features(q, ctx) @ self.weights)

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps({"features": list(FEATURES), "weights": self.weights.tolist(),
                                          **self.meta}, indent=2))


def load_calibration(path) -> Calibration:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"calibration file not found: {p} (make one with `python -m policylab calibrate`)")
    data = json.loads(p.read_text())
    if data.get("features") != list(FEATURES):
        raise ValueError(f"{p}: features {data.get('features')} do not match this version's {list(FEATURES)}")
    return Calibration(np.asarray(data["weights"], dtype=float),
                       {k: v for k, v in data.items() if k not in ("features", "weights")})
