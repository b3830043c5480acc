"""`dataplane.time_noise`: the sim's step times with seeded multiplicative error, to show how far
a replay moves under step-time error as small as a measuring timer's (README: trust)."""
from __future__ import annotations

import numpy as np
import pytest

from policies.prefill_first import PrefillFirst
from policylab.core.batch import Batch
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.core.engine import Engine
from policylab.core.request import TraceRequest as T
from policylab.dataplane.sim import SimDataPlane

BATCH = Batch([0, 1], [1, 300], [700, 0], [[0], [1]], [], [True, True], [None, None])


def durations(noise: float, seed: int, n: int = 50) -> list:
    plane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim", time_noise=noise,
                                                                          time_noise_seed=seed))
    return [plane.execute(BATCH).duration for _ in range(n)]


def test_noise_is_seeded_unbiased_and_off_by_default():
    exact = durations(0.0, 0)
    assert len(set(exact)) == 1                                   # no noise: the cost model, every time
    noisy = np.array(durations(0.01, 3, 2000))
    assert durations(0.01, 3) == noisy[:50].tolist()              # the same seed, the same errors
    assert durations(0.01, 4) != noisy[:50].tolist()
    rel = noisy / exact[0] - 1
    assert abs(rel.mean()) < 0.002 and 0.008 < rel.std() < 0.012


def test_a_noisy_replay_differs_from_the_exact_one_and_says_so():
    trace = [T(0.05 * i, 200 + 37 * i % 300, 20 + i % 7) for i in range(40)]
    runs = {}
    for noise in (0.0, 0.01):
        dp = DataplaneConfig(kind="sim", time_noise=noise)
        plane = SimDataPlane(ModelConfig(), HardwareConfig(), dp)
        result = Engine(trace, PrefillFirst(), plane, EngineConfig()).run()
        runs[noise] = ([r.finish_time for r in result.requests], plane.describe_cost_model())
    assert runs[0.0][0] != runs[0.01][0]
    assert "time_noise" not in runs[0.0][1] and runs[0.01][1]["time_noise"] == 0.01


@pytest.mark.parametrize("bad", [-0.01, 0.5, float("nan"), "1%"])
def test_bad_noise_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="dataplane.time_noise"):
        SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim", time_noise=bad))
