"""The fitted cost model of the sim data plane: step time as a non-negative linear function
of batch features, fitted on the real plane by `python -m policylab calibrate`.

It lives beside the sim that reads it (`dataplane.calibration=FILE`); the app that measures
and fits it (`policylab.apps.calibrate`) imports it from here, never the other way round.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from policylab.dataplane.host_time import HostTime

FEATURES = ("const", "tokens", "sampled", "seqs", "masked_groups", "decode_kv", "decode_padded_kv",
            "prefill_pairs", "prefill_causal_pairs", "prefill_masked_pairs", "prefill_padded_keys")


def batch_features(q: np.ndarray, ctx: np.ndarray, sampled: int | None = None) -> np.ndarray:
    """Feature vector of one batch given per-request query and context lengths and the number
    of requests sampled (None: all; a chunk that leaves part of its prompt samples nothing).

    Besides the work itself (tokens through the layers, sampled rows through the LM head,
    KV tokens read, query-key pairs), the padded work of a batched attention kernel: the
    torch backend attends decodes as one group padded to the longest context, and prefill
    chunks as one group padded to the longest chunk and the longest sequence, so one long
    request makes the whole group cost more; a group of equal fresh prompts runs SDPA's causal
    kernel, any other group an explicit mask (dearer per pair, with a fixed cost to build and
    apply it). The fit keeps
    whichever terms the plane shows (a backend without padding leaves those at zero).
    """
    decode = (q == 1) & (ctx > 0)
    prefill = ~decode
    n_dec, n_pre = int(decode.sum()), int(prefill.sum())
    qp, cp = q[prefill], ctx[prefill]
    max_seq = float((qp + cp).max()) if n_pre else 0.0
    padded = n_pre * (float(qp.max()) if n_pre else 0.0) * max_seq / 1e6
    causal = n_pre > 0 and qp.max() > 1 and (qp == qp[0]).all() and not cp.any()
    decode_ctx = ctx[decode]
    masked_groups = (n_dec > 1 and decode_ctx.min() != decode_ctx.max()) + (n_pre > 0 and not causal)
    return np.array([
        1.0,
        q.sum(),
        float(len(q) if sampled is None else sampled),
        float(len(q)),
        float(masked_groups),
        (ctx[decode].sum() + n_dec) / 1e3,
        n_dec * (float(ctx[decode].max()) + 1 if n_dec else 0.0) / 1e3,
        float(np.dot(qp, cp + (qp + 1) / 2)) / 1e6,
        padded if causal else 0.0,
        0.0 if causal else padded,
        n_pre * max_seq / 1e3,
    ])


@dataclass
class Calibration:
    """The fit, and optionally host time it did not see: a fit of vLLM's steps in process misses what
    its OpenAI server adds to every step (its engine core and worker in other processes, each step's
    outputs streamed), which a `host` preset measured on that server states (`host`: a HostTime)."""
    weights: np.ndarray     # seconds per unit of each feature
    meta: dict

    path: str = ""
    host: Optional[HostTime] = None

    def predict(self, q: np.ndarray, ctx: np.ndarray, sampled: int | None = None) -> float:
        return float(batch_features(q, ctx, sampled) @ self.weights)

    def step_time(self, q, ctx, tokens: int, sampled: int) -> float:
        seconds = self.predict(np.asarray(q, float), np.asarray(ctx, float), sampled)
        return seconds if self.host is None else seconds + self.host(len(q), tokens)

    def describe(self) -> dict:
        path = Path(self.path)
        out = {"kind": "fit", "file": str(path.resolve()), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        return out if self.host is None else {**out, "host_time": self.host.describe()}

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps({"features": list(FEATURES), "weights": self.weights.tolist(),
                                          **self.meta}, indent=2))


def load_calibration(path) -> Calibration:
    """A calibration file, checked: every problem is one line naming the file and the key."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"calibration file not found: {p} (make one with `python -m policylab calibrate`)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{p}: not a calibration JSON file ({e})") from None
    if not isinstance(data, dict) or "features" not in data or "weights" not in data:
        raise ValueError(f"{p}: expected a JSON object with 'features' and 'weights' "
                         f"(written by `python -m policylab calibrate`), got {type(data).__name__}"
                         + (f" with keys {sorted(data)[:6]}" if isinstance(data, dict) else ""))
    if data.get("features") != list(FEATURES):
        raise ValueError(f"{p}: features {data.get('features')} do not match this version's {list(FEATURES)}")
    weights = data["weights"]
    if not (isinstance(weights, list) and len(weights) == len(FEATURES)
            and all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights)):
        raise ValueError(f"{p}: 'weights' must be a list of {len(FEATURES)} numbers, got {weights!r:.80}")
    if not all(0 <= w < math.inf for w in weights):    # (NaN fails): a step must cost a finite time >= 0
        raise ValueError(f"{p}: 'weights' must be finite and >= 0 (seconds per unit of {list(FEATURES)}), "
                         f"got {weights}")
    return Calibration(np.asarray(weights, dtype=float),
                       {k: v for k, v in data.items() if k not in ("features", "weights")}, str(p))
