"""policylab's half of the vLLM conformance check runs without vLLM: the scenario replays on the
engine with `vllm_v1` and the sim's ids, each step one time unit long (so that step numbers, not
modelled seconds, line the two schedulers up). The vLLM tier compares it with vLLM itself."""
import pytest

from policylab.testing.vllm_conformance import VllmRequest, VllmScenario, run_policylab

pytestmark = pytest.mark.timeout(120)


def test_the_engine_half_replays_a_scenario_one_time_unit_a_step():
    scenario = VllmScenario(requests=(VllmRequest(0, tuple(range(1, 70)), 5),
                                      VllmRequest(1, tuple(range(100, 140)), 3)))
    records, outputs, cached, livelocked = run_policylab(scenario)
    assert not livelocked and cached == 0
    assert [len(o) for o in outputs] == [5, 3]
    assert records, "no step recorded"
