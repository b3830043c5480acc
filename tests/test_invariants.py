"""DESIGN §8 over every shipped policy (configs/policy/*.yaml), or over `--policy=SPEC`
(python -m pytest -p policylab.testing.pytest_plugin tests/test_invariants.py --policy=...).

Besides the generic suite: the harness itself must catch broken policies.
"""
import pytest
from hypothesis import given

from policies.chunked import Chunked
from policies.decode_first import DecodeFirst
from policies.fairness import Fairness
from policies.prefill_first import PrefillFirst
from policies.priority import Priority
from policylab.core.contract import StepPlan
from policylab.testing import InvariantViolation, check_policy, run_checked
from policylab.testing.strategies import lever_scenarios, scenarios
from policylab.testing.suite import (pressure_scenario, pytest_generate_tests,  # noqa: F401
                                     test_invariants_on_generated_scenarios,
                                     test_invariants_under_kv_pressure, test_invariants_with_kv_levers_on,
                                     test_invariants_with_tool_calls,
                                     test_invariants_with_swap_preemption_forced)


VARIANTS = {   # parameter settings the shipped YAMLs do not use
    "slo_aware_reject": {"_target_": "policies.slo_aware.SloAware", "late_policy": "reject",
                         "chunk_size": 64},
    "decode_first_free_slots": {"_target_": "policies.decode_first.DecodeFirst",
                                "admit_into_free_slots": True},
    "chunked_3_partials": {"_target_": "policies.chunked.Chunked", "chunk_size": 48,
                           "max_partial_prefills": 3},
    "fairness_weighted": {"_target_": "policies.fairness.Fairness", "chunk_size": 32,
                          "weights": {"alice": 3, "bob": 0.5}},
    "priority_fast_aging": {"_target_": "policies.priority.Priority", "aging_rate": 50.0},
    "lpm_max_wait": {"_target_": "policies.lpm.LongestPrefixMatch", "aging_rate": 0.0, "max_wait_s": 0.02},
    "lpm_aging_and_max_wait": {"_target_": "policies.lpm.LongestPrefixMatch", "aging_rate": 20.0, "max_wait_s": 0.05},
    "dfs_weight_tight_bound": {"_target_": "policies.dfs_weight.DfsWeight", "chunk_size": 64, "max_wait_s": 0.01},
    "dfs_weight_no_bound": {"_target_": "policies.dfs_weight.DfsWeight", "max_wait_s": None},
}
SWAP_VARIANTS = {   # policies that swap, on engines with and without a host tier
    "chunked_swap": {"_target_": "policies.chunked.Chunked", "chunk_size": 64, "preempt_mode": "swap"},
    "lpm_swap": {"_target_": "policies.lpm.LongestPrefixMatch", "chunk_size": 64, "preempt_mode": "swap"},
    "lpm_slow_aging": {"_target_": "policies.lpm.LongestPrefixMatch", "aging_rate": 5.0},
    "dfs_weight_swap": {"_target_": "policies.dfs_weight.DfsWeight", "chunk_size": 64, "preempt_mode": "swap",
                        "max_wait_s": 0.02},
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@given(scenario=scenarios())
def test_invariants_of_parameter_variants(variant, scenario):
    check_policy(VARIANTS[variant], scenario)


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(SWAP_VARIANTS))
@given(scenario=lever_scenarios(host_blocks=(4, 64)))     # (swap with no host tier is refused before the run)
def test_invariants_of_swapping_policies_with_kv_levers(variant, scenario):
    check_policy(SWAP_VARIANTS[variant], scenario)


def test_pressure_scenario_preempts_and_hits_the_prefix_cache():
    result = run_checked(PrefillFirst, pressure_scenario(0))
    assert sum(r.num_preemptions for r in result.requests) > 0
    assert sum(r.num_cached_tokens_total for r in result.requests) > 0


class StallingChunked(Chunked):
    """Claims stall-free but skips the first running decode every other step."""

    def schedule(self, view):
        plan = super().schedule(view)
        decodes = [v.req_id for v in view.running if v.is_decode and v.req_id in plan.num_scheduled_tokens]
        if view.step % 2 and len(decodes) > 1:
            del plan.num_scheduled_tokens[decodes[0]]
        return plan


class MixingPrefillFirst(PrefillFirst):
    """prefill_first that also decodes in prefill steps: breaks single_phase."""

    properties = ("single_phase",)

    def schedule(self, view):
        plan = super().schedule(view)
        budget = view.max_num_batched_tokens - plan.total_tokens
        for v in view.running:
            if v.is_decode and budget > 0 and v.req_id not in plan.num_scheduled_tokens \
                    and v.req_id not in plan.preempt and view.blocks_needed(v, 1) == 0:
                plan.num_scheduled_tokens[v.req_id] = 1
                budget -= 1
        return plan


class Thrashing(Chunked):
    """Computes one token of a prompt, preempts it, starts over: a preempt/requeue livelock."""

    def schedule(self, view):
        if view.running:
            return StepPlan(preempt=[v.req_id for v in view.running])
        return StepPlan({view.waiting[0].req_id: 1})


class Idle(Chunked):
    """Returns an empty plan at step 3 although requests wait and run: not work-conserving."""

    def schedule(self, view):
        return StepPlan() if view.step == 3 else super().schedule(view)


class Forgetful(Chunked):
    """Decides differently on a second replay (state kept across instances): nondeterministic."""

    runs = 0

    def __init__(self):
        super().__init__()
        Forgetful.runs += 1
        self.chunk_size = 16 if Forgetful.runs % 2 else 512


@pytest.mark.parametrize("policy, invariant", [
    (StallingChunked, "stall_free"), (MixingPrefillFirst, "single_phase"),
    (Thrashing, "liveness"), (Idle, "work_conservation"), (Forgetful, "determinism")])
def test_harness_catches_a_broken_policy(policy, invariant):
    with pytest.raises(InvariantViolation) as caught:
        check_policy(policy, pressure_scenario(0), max_steps=3000)
    assert caught.value.invariant == invariant


class ResettingFairness(Fairness):
    """Forgets its counters every 5 steps: VTC counters must never decrease."""

    def schedule(self, view):
        if view.step % 5 == 4:
            self.counters.clear()
        return super().schedule(view)


class LifoPriority(Priority):
    """Admits the latest arrival first, ignoring priority and aging."""

    def admission_order(self, view):
        return list(reversed(view.waiting))


class EagerDecodeFirst(DecodeFirst):
    """Admits into free slots while claiming request-level batching."""

    def __init__(self):
        super().__init__(admit_into_free_slots=True)
        self.properties = ("drained_admission",)


@pytest.mark.parametrize("policy, invariant", [
    (ResettingFairness, "vtc"), (LifoPriority, "aging_bound"), (EagerDecodeFirst, "drained_admission")])
def test_harness_catches_a_broken_policy_specific_property(policy, invariant):
    with pytest.raises(InvariantViolation) as caught:
        check_policy(policy, pressure_scenario(0))
    assert caught.value.invariant == invariant
