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


def test_a_live_vllm_request_stands_behind_a_request_view_without_vllm():
    """The adapter's `LiveRequest` answers what a `RequestView` copies at creation (its id and
    prompt length) from vLLM's request; a stand-in with vLLM's field names is enough to check it."""
    from types import SimpleNamespace

    from policylab.integrations.vllm.view import LiveRequest, new_request_view
    vllm_request = SimpleNamespace(prompt_token_ids=list(range(37)), num_prompt_tokens=37, priority=0,
                                   max_tokens=8, output_token_ids=[], num_tokens=37, num_computed_tokens=0)
    view = new_request_view(LiveRequest(4, vllm_request, None, 0.0, {}), None)
    assert (view.req_id, view.prompt_len) == (4, 37)
