"""Calibration fit: recovers a known cost model, stays non-negative, round-trips through JSON."""
import json

import numpy as np
import pandas as pd
import pytest

from policylab.apps.calibrate import batch_grid, fit, nnls
from policylab.dataplane.fitted import FEATURES, batch_features, load_calibration
from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.core.batch import Batch
from policylab.dataplane.sim import SimDataPlane

# const, tokens, sampled, seqs (0: the grid samples every request, so it equals `sampled`), masked_groups,
# decode_kv, decode_padded_kv, prefill_pairs, prefill_causal_pairs, prefill_masked_pairs, prefill_padded_keys
TRUE_W = np.array([2e-3, 4e-5, 5e-5, 0.0, 1e-3, 2e-5, 1e-5, 3e-2, 1e-2, 2e-2, 1e-5])


def synthetic_profile(noise=0.02, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for q, ctx in batch_grid(2048, 128, 4096):
        f = batch_features(np.asarray(q, float), np.asarray(ctx, float))
        rows.append({**dict(zip(FEATURES, f)), "time": float(f @ TRUE_W) * (1 + noise * rng.standard_normal())})
    return pd.DataFrame(rows)


def test_fit_recovers_known_cost_model():
    calibration, mape = fit(synthetic_profile(noise=0.0))
    assert mape < 1e-6
    w = calibration.weights               # sampled and seqs are equal on the grid: only their sum is known
    np.testing.assert_allclose(np.delete(w, [2, 3]), np.delete(TRUE_W, [2, 3]), rtol=1e-4)
    assert w[2] + w[3] == pytest.approx(TRUE_W[2] + TRUE_W[3], rel=1e-4)


def test_fit_with_noise_has_small_heldout_error():
    calibration, mape = fit(synthetic_profile(noise=0.02))
    assert mape < 0.05
    assert calibration.meta["n_test"] > 0 and calibration.meta["n_train"] > calibration.meta["n_test"]


def test_nnls_never_returns_negative_weights():
    rng = np.random.default_rng(1)
    A = rng.random((40, 4))
    b = A @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.01 * rng.standard_normal(40)
    w = nnls(A, b)
    assert (w >= 0).all()
    assert w[1] == 0.0


def test_grid_covers_prefill_decode_and_mixed_batches():
    grid = batch_grid(512, 32, 2048)
    assert any(len(q) == 1 and q[0] > 1 for q, _ in grid)                      # prefill only
    assert any(all(n == 1 for n in q) and len(q) > 1 for q, _ in grid)          # decode only
    assert any(q[0] > 1 and len(q) > 1 for q, _ in grid)                        # mixed
    assert all(sum(q) <= 512 + 32 and len(q) <= 33 for q, _ in grid)


def test_calibration_round_trip_drives_the_sim(tmp_path):
    calibration, _ = fit(synthetic_profile(noise=0.0))
    path = tmp_path / "calibration.json"
    calibration.save(path)
    sim = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim", calibration=str(path)))
    batch = Batch([0, 1], [300, 1], [0, 700], [[0], [1]], [], [True, True], [None, None])
    expected = batch_features(np.array([300.0, 1.0]), np.array([0.0, 700.0])) @ TRUE_W
    assert sim.execute(batch).duration == pytest.approx(expected, rel=1e-6)


def test_calibration_with_other_features_is_refused(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"features": ["const", "tokens"], "weights": [1, 2]}))
    with pytest.raises(ValueError, match="features"):
        load_calibration(path)
    with pytest.raises(FileNotFoundError, match="policylab calibrate"):
        load_calibration(tmp_path / "missing.json")
