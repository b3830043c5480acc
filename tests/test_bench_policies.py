"""experiments/bench_policies.py measures what it says: every shipped policy by default, and under
--instructions an engine whose data plane hands back recorded results steps exactly as the engine
whose sim plane computed them (so only the control plane is counted)."""
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.chdir(ROOT)                       # (it reads the checkout it runs in)
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    import bench_policies
    return bench_policies


@pytest.mark.timeout(60)
def test_the_default_list_is_every_shipped_policy(bench):
    assert sorted(bench.POLICIES) == sorted(path.stem for path in (ROOT / "configs" / "policy").glob("*.yaml"))
    assert len(set(bench.POLICIES)) == len(bench.POLICIES)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy", ["vllm_v1", "fairness"])
def test_recorded_plane_results_replay_the_steady_engine_step_for_step(bench, policy):
    step, check = bench.replayed_steps(policy, 16, 40)
    for _ in range(40):
        step()
    check()                                       # exits unless it ended where the computing engine did
    step, check = bench.replayed_steps(policy, 16, 40)
    step()
    with pytest.raises(SystemExit, match="did not step as"):
        check()                                   # (and the check can tell)
