"""Calibrate the sim data plane on the real one: profile a grid of batches, fit a cost model.

Step time is modelled as a non-negative linear function of batch features
(`policylab.dataplane.fitted.FEATURES`: a fixed per-step cost, tokens through the dense
layers, sampled rows, requests, KV tokens read and query-key pairs, and the padded work
of the batched attention kernel), fitted by non-negative least squares on measured steps
(median of repeats after warm-up, plus every step of a replay). Measure with
`dataplane.timer=cpu` on a shared CPU: the fit then follows the plane, not the neighbours.
The fit is saved as JSON; `dataplane=sim dataplane.calibration=FILE` replays with it.
"""
from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from policylab.core.batch import Batch
from policylab.core.kv import blocks_for
from policylab.core.request import SamplingParams
from policylab.dataplane.fitted import FEATURES, Calibration, batch_features

def batch_grid(max_tokens: int, max_seqs: int, max_len: int) -> list:
    """(query_lens, context_lens) shapes: prefill chunks, decode batches and mixed batches."""
    chunks = [c for c in (16, 64, 128, 256, 512, 1024, 2048) if c <= max_tokens]
    contexts = [c for c in (0, 256, 1024, 2048) if c < max_len]
    decodes = [b for b in (1, 4, 16, 32, 64, 128) if b <= max_seqs]
    kv_lens = [k for k in (64, 256, 1024, 2048) if k < max_len]
    grid = [([c], [x]) for c, x in itertools.product(chunks, contexts) if c + x <= max_len]
    grid += [([1] * b, spread(k, b, max_len)) for b, k in itertools.product(decodes, kv_lens)]
    grid += [([c] + [1] * b, [0] + spread(k, b, max_len)) for c, b, k in
             itertools.product(chunks[1::2], decodes[1::2], kv_lens[::2]) if c + b <= max_tokens and b + 1 <= max_seqs]
    return grid


def spread(mean: int, n: int, max_len: int) -> list:
    """n context lengths from mean/2 to 3·mean/2: real decode batches are never uniform, and
    uneven lengths cost more (padding and masks) than a batch of equal ones."""
    return [min(max_len - 1, max(1, int(mean * (0.5 + i / max(n - 1, 1))))) for i in range(n)]


def _make_batch(q: list, ctx: list, num_blocks: int, block_size: int, vocab: int, rng) -> Batch:
    """A batch whose block tables are scattered over the cache, as after a while of serving."""
    free = iter(rng.permutation(num_blocks).tolist())
    tables = [[next(free) for _ in range(blocks_for(n + c, block_size))] for n, c in zip(q, ctx)]
    return Batch(list(range(len(q))), list(q), list(ctx), tables,
                 [rng.integers(16, vocab, n).astype(np.int32) for n in q],
                 [True] * len(q), [SamplingParams()] * len(q))


def profile(dataplane, grid: list, block_size: int = 16, repeats: int = 5, warmup: int = 2,
            seed: int = 0, progress=None) -> pd.DataFrame:
    """Time every batch shape of the grid on a data plane; one row per shape (median time)."""
    need = max(sum(blocks_for(n + c, block_size) for n, c in zip(q, ctx)) for q, ctx in grid)
    num_blocks = max(need, dataplane.num_kv_blocks(block_size))
    dataplane.allocate_kv(num_blocks, block_size)
    rng = np.random.default_rng(seed)
    rows = []
    for i, (q, ctx) in enumerate(grid):
        batch = _make_batch(q, ctx, num_blocks, block_size, dataplane.vocab_size, rng)
        times = []
        for k in range(warmup + repeats):
            t0 = time.perf_counter()
            duration = dataplane.execute(batch).duration
            if k >= warmup:
                times.append(duration if duration > 0 else time.perf_counter() - t0)
        f = batch_features(np.asarray(q, float), np.asarray(ctx, float))
        rows.append({"query_lens": q, "context_lens": ctx, **dict(zip(FEATURES, f)),
                     "time": float(np.median(times))})
        if progress:
            progress(i + 1, len(grid))
    return pd.DataFrame(rows)


def replay_profile(engine) -> pd.DataFrame:
    """Every step of a replay on the real plane as a profile row: the batches policies really form
    (uneven contexts, scattered blocks, allocator state) which a grid only approximates."""
    rows, execute = [], engine.dataplane.execute

    def recorded(batch):
        result = execute(batch)
        q, ctx = list(batch.query_lens), list(batch.context_lens)
        f = batch_features(np.asarray(q, float), np.asarray(ctx, float), sum(batch.sample))
        rows.append({"query_lens": q, "context_lens": ctx, **dict(zip(FEATURES, f)), "time": result.duration})
        return result
    engine.dataplane.execute = recorded
    try:
        result = engine.run()
    finally:
        del engine.dataplane.execute          # back to the class's method
    if result.partial:
        raise RuntimeError(f"calibration replay stopped early: {result.error}")
    return pd.DataFrame(rows)


def fit(profile_df: pd.DataFrame, holdout: float = 0.25, seed: int = 0) -> tuple:
    """Non-negative least squares on a random split; returns (Calibration, held-out MAPE)."""
    rng = np.random.default_rng(seed)
    test = rng.random(len(profile_df)) < holdout
    X, y = profile_df[list(FEATURES)].to_numpy(float), profile_df["time"].to_numpy(float)
    w = nnls(X[~test] / y[~test, None], np.ones((~test).sum()))   # relative error weighting
    pred = X @ w
    mape = float(np.mean(np.abs(pred[test] - y[test]) / y[test])) if test.any() else float("nan")
    train_mape = float(np.mean(np.abs(pred[~test] - y[~test]) / y[~test]))
    return Calibration(w, {"heldout_mape": mape, "train_mape": train_mape,
                           "n_train": int((~test).sum()), "n_test": int(test.sum())}), mape


def nnls(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with non-negative weights (Lawson-Hanson, scipy): a cost is never negative."""
    from scipy.optimize import nnls as lawson_hanson
    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    return lawson_hanson(A / scale, b)[0] / scale        # columns scaled alike: better conditioned


def calibrate(dataplane, engine_cfg, run_dir: Path, seed: int = 0, replay_engine=None) -> Calibration:
    """Profile the grid on `dataplane` (plus every step of `replay_engine`'s replay when given),
    fit, and save profile.csv + calibration.json in run_dir."""
    grid = batch_grid(engine_cfg.max_num_batched_tokens, engine_cfg.max_num_seqs,
                      min(engine_cfg.max_model_len, 4096))
    bar = lambda i, n: print(f"\rprofiling batch {i}/{n}", end="" if i < n else "\n", file=sys.stderr)
    dp = getattr(dataplane, "dp", None)
    if dp is not None and dp.timer_repeats > 1:     # the plane keeps the least of k runs already
        df = profile(dataplane, grid, engine_cfg.block_size, repeats=1, warmup=1, seed=seed, progress=bar)
    else:
        df = profile(dataplane, grid, engine_cfg.block_size, seed=seed, progress=bar)
    if replay_engine is not None:
        print(f"profiling the {len(replay_engine.trace)}-request replay of {replay_engine.policy_name}",
              file=sys.stderr)
        df = pd.concat([df, replay_profile(replay_engine)], ignore_index=True)
    df.to_csv(run_dir / "profile.csv", index=False)
    calibration, mape = fit(df, seed=seed)
    describe = getattr(dataplane, "describe_cost_model", None)
    calibration.meta["measured_on"] = describe() if describe else None
    calibration.save(run_dir / "calibration.json")
    print(f"calibration: {len(df)} batch shapes, held-out MAPE {mape:.1%} "
          f"(train {calibration.meta['train_mape']:.1%}) -> {run_dir / 'calibration.json'}")
    return calibration
