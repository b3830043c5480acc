"""A measured GPU profile as the sim's cost model (`dataplane.profile=DIR` or a downloaded
profile's name, `dataplane.profile=a100/meta-llama/Meta-Llama-3-8B`), read as Vidur publishes it.

DIR holds Vidur's compute profile of one model on one GPU (github.com/microsoft/vidur,
`data/profiling/compute/<gpu>/<model>/`; `python -m policylab profile download NAME` fetches it).
`mlp.csv` gives the median kernel time (ms) of each op of one transformer block at each
`num_tokens`; a step costs, for its n scheduled tokens,

    layers x Σ op(n)  +  emb(n)  +  tp all-reduces  +  LM head  +  attention  +  step_overhead

with op(n) interpolated piecewise-linearly in log(time) over log(num_tokens): it passes through
every measurement and never overshoots between two of them (a spline would), and past the
largest measured n it grows linearly, as a compute-bound GEMM does. The residual add is counted
twice per layer (a Llama block has two; the profile times one). A profile without a
post_attention_layernorm column is of phi-2's parallel block (one norm, one timed add of
attention, MLP and residual: counted once), as Vidur reads it; its model must say
`architecture: phi`. Vidur does not profile the LM head, so it comes from the roofline;
attention comes from `attention.csv` when the directory has one (see
`policylab.dataplane.profile_attention`), else from the roofline.

With `dataplane.tensor_parallel=k > 1` the rows with `num_tensor_parallel_workers == k` are
used (per-GPU shards) and each layer adds two all-reduces of n x hidden activations (after the
attention output and the MLP down projections, plus one for the vocabulary-parallel
embedding), timed from the network profile's `all_reduce.csv` (`dataplane.network_profile=DIR`).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.config import SimPlaneConfig
from policylab.datasets.cache import DatasetError, profile_path
from policylab.dataplane.profile_csv import ProfileError, floats, read_table, select_tp
from policylab.dataplane.parallel import Link
from policylab.dataplane.roofline import Roofline

LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add", "add")
PARALLEL_LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "mlp_up_proj", "mlp_act",
                      "mlp_down_proj", "add")     # phi-2: x + attn(ln(x)) + mlp(ln(x)), one timed add
SHAPE_COLUMNS = {"n_embd": "hidden_size", "n_head": "num_attention_heads", "n_kv_head": "num_key_value_heads",
                 "n_expanded_embd": "intermediate_size", "vocab_size": "vocab_size"}


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class LogInterp:
    """y(x) piecewise linear in log-log through the points (duplicates of x averaged); linear beyond."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        xs, inverse = np.unique(x, return_inverse=True)
        ys = np.bincount(inverse, weights=y) / np.bincount(inverse)
        self.lx, self.ly = np.log(xs), np.log(np.maximum(ys, 1e-9))
        self.x_max, self.y_max = xs[-1], ys[-1]

    def __call__(self, x: float) -> float:
        if x > self.x_max:
            return float(self.y_max * x / self.x_max)
        return float(np.exp(np.interp(np.log(x), self.lx, self.ly)))


def check_shape(table: dict, model: ModelConfig, path: Path) -> None:
    """Refuse a profile of another model shape, naming each mismatch."""
    wrong = []
    for column, field in SHAPE_COLUMNS.items():
        values = set(table[column])
        want = getattr(model, field)
        if len(values) != 1 or float(values.pop()) != want:
            wrong.append(f"{column}={'/'.join(sorted(set(table[column])))} but model.{field}={want}")
    gated = {v.strip().lower() in ("true", "1") for v in table.get("use_gated_mlp", ["true"])}
    if gated != {model.architecture != "phi"}:
        wrong.append(f"use_gated_mlp={'/'.join(sorted(set(table['use_gated_mlp'])))} but model.architecture="
                     f"{model.architecture} (phi: GELU MLP; the others: gated)")
    if wrong:
        raise ProfileError(f"{path}: profile is of another model shape than '{model.name}': {'; '.join(wrong)}")


class AllReduce:
    """All-reduce time (s) of a message of `size` bytes among `tp` GPUs, from a Vidur all_reduce.csv."""

    def __init__(self, path: Path, tp: int):
        t = read_table(path, ("time_stats.all_reduce.median", "num_workers", "size", "devices_per_node"))
        workers, per_node = floats(t, "num_workers", path), floats(t, "devices_per_node", path)
        rows = workers == tp
        if not rows.any():
            raise ProfileError(f"{path}: no rows with num_workers={tp} (dataplane.tensor_parallel); "
                               f"the file has {sorted(set(workers.astype(int).tolist()))}")
        if (rows & (per_node == tp)).any():          # all GPUs of the group in one node, as for TP
            rows &= per_node == tp
        self.curve = LogInterp(floats(t, "size", path, rows), floats(t, "time_stats.all_reduce.median", path, rows) / 1e3)

    def __call__(self, size: float) -> float:
        return self.curve(size)


def _profile_dir(value: str, key: str) -> Path:
    """A directory, or a downloaded Vidur profile's name (`python -m policylab profile list`)."""
    try:
        return profile_path(str(value))
    except DatasetError as e:
        raise ProfileError(f"{key}={value}: {e}") from None


class ProfileCostModel:
    """Step time from measured per-op kernel times (see module doc); dense part cached per token count."""

    def __init__(self, model: ModelConfig, hw: HardwareConfig, dp: SimPlaneConfig):
        self.roofline = Roofline(model, hw)
        self.tp, self.layers, self.overhead = dp.tensor_parallel, model.num_hidden_layers, hw.step_overhead
        directory = _profile_dir(dp.profile, "dataplane.profile")
        self.mlp_path = directory / "mlp.csv"
        table = read_table(self.mlp_path, [f"time_stats.{op}.median" for op in sorted(set(PARALLEL_LAYER_OPS))]
                           + ["time_stats.emb.median", "num_tokens", "num_tensor_parallel_workers", *SHAPE_COLUMNS])
        check_shape(table, model, self.mlp_path)
        self.layer_ops = LAYER_OPS if "time_stats.post_attention_layernorm.median" in table else PARALLEL_LAYER_OPS
        ops = sorted(set(self.layer_ops)) + ["emb"]
        rows = select_tp(table, self.tp, self.mlp_path)
        n = floats(table, "num_tokens", self.mlp_path, rows)
        self.ops = {op: LogInterp(n, floats(table, f"time_stats.{op}.median", self.mlp_path, rows) / 1e3)
                    for op in ops}
        self.files = [self.mlp_path]
        self.all_reduce = None
        if self.tp > 1:
            if dp.network_profile:
                path = _profile_dir(dp.network_profile, "dataplane.network_profile") / "all_reduce.csv"
                self.all_reduce, self.files = AllReduce(path, self.tp), self.files + [path]
            else:                      # the hardware's link model (policylab.dataplane.parallel)
                self.all_reduce = Link(hw, self.tp).all_reduce
        self.attention = None
        if (directory / "attention.csv").is_file():
            from policylab.dataplane.profile_attention import ProfiledAttention
            self.attention = ProfiledAttention(directory / "attention.csv", model, self.tp)
            self.files.append(directory / "attention.csv")
        self.activation_bytes = model.hidden_size * model.dtype_bytes
        self._dense: dict = {}

    def describe(self) -> dict:
        return {"kind": "profile", "file": str(self.mlp_path.resolve()), "sha256": sha256_of(self.mlp_path),
                "files": {str(p.resolve()): sha256_of(p) for p in self.files}, "tensor_parallel": self.tp}

    def dense_time(self, tokens: int) -> float:
        """Layers (per-op, interpolated) + embedding + all-reduces: the profile's part of a step."""
        t = self._dense.get(tokens)
        if t is None:
            ops = self.ops
            t = self.layers * sum(ops[op](tokens) for op in self.layer_ops) + ops["emb"](tokens)
            if self.all_reduce is not None:
                t += (2 * self.layers + 1) * self.all_reduce(tokens * self.activation_bytes)
            self._dense[tokens] = t
        return t

    def step_time(self, q, ctx, tokens: int, sampled: int) -> float:
        if self.attention is not None:
            attn = self.attention(q, ctx) * self.layers
        else:
            attn = self.roofline.attention_time(q, ctx, tokens) / self.tp
        return self.dense_time(tokens) + self.roofline.lm_head_time(sampled) / self.tp + attn + self.overhead
