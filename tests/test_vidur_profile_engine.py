"""Vidur's profiles are priced on the library they were taken with (`serving_engine=vidur`), and
experiments/vidur_gemm_efficiency.py reads their GEMMs' share of peak (docs/fidelity.md)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "data" / "vidur"
sys.path.insert(0, str(ROOT / "experiments"))


@pytest.mark.timeout(60)
def test_the_profile_checks_price_vidurs_profiles_without_persistent_gemms():
    from vidur_profiles import cases, set_engine
    found = cases(SAMPLE)
    assert found and all(c.engine.cfg.name == "vidur" and not c.engine.cfg.persistent_gemms for c in found)
    set_engine(found, "none")
    assert all(c.engine.cfg.persistent_gemms for c in found)


@pytest.mark.timeout(120)
def test_gemm_efficiency_is_flops_over_time_and_peak():
    from vidur_gemm_efficiency import points
    from vidur_profiles import cases
    case = cases(SAMPLE)[0]
    pts = points(case)
    assert len(pts) == 4 * len({p[1] for p in pts}) > 40       # the four GEMMs at every profiled count
    for op, m, k, n, t, eff, waves in pts:
        assert eff == pytest.approx(2 * m * k * n / t / case.hardware.peak_flops)
        assert 0 < eff < 1 and waves > 0
    out = subprocess.run([sys.executable, str(ROOT / "experiments" / "vidur_gemm_efficiency.py"), str(SAMPLE),
                          "--gpu", "a100"], capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "waves of output tiles" in out.stdout and ">= 2,049" in out.stdout
