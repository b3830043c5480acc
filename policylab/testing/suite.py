"""The generic invariant suite (DESIGN §8), parametrized over `policy_spec`.

`policy_spec` is each `--policy` given to pytest (with `-p policylab.testing.pytest_plugin`),
else every shipped policy config. Import this module's names into a test module (as
tests/test_invariants.py does) or collect it with `--pyargs policylab.testing.suite`.
"""
from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings

from policylab.core.config import EngineConfig
from policylab.core.request import TraceRequest
from policylab.testing.harness import Scenario, check_policy, reproduction
from policylab.testing.loader import policy_factory, shipped_policy_configs, spec_id
from policylab.testing.strategies import scenarios


def pytest_generate_tests(metafunc) -> None:
    if "policy_spec" in metafunc.fixturenames:
        specs = metafunc.config.getoption("policy", default=None) or shipped_policy_configs()
        metafunc.parametrize("policy_spec", specs, ids=[spec_id(s) for s in specs])


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_invariants_on_generated_scenarios(policy_spec, scenario):
    check_policy(policy_spec, scenario)


def pressure_scenario(seed: int) -> Scenario:
    """A fixed burst much larger than the KV cache: preemption and recompute are certain."""
    trace = tuple(TraceRequest(arrival_time=0.002 * (i // 6), prompt_tokens=40 + 17 * i % 90,
                               output_tokens=12 + 7 * i % 20, client=("a", "b")[i % 2], priority=i % 3,
                               prefix_hashes=(1,) if i % 3 == 0 else ())
                  for i in range(30))
    cfg = EngineConfig(block_size=8, num_blocks=40, max_num_batched_tokens=128, max_num_seqs=12)
    return Scenario(trace, cfg, seed=seed, prefix_block_tokens=32)


def test_invariants_under_kv_pressure(policy_spec):
    """On failure the exception carries the scenario as code that reproduces it alone."""
    for seed in (0, 1):
        scenario = pressure_scenario(seed)
        try:
            check_policy(policy_spec, scenario)
        except Exception as e:
            e.add_note(reproduction(policy_spec, scenario))
            raise


def test_invariants_with_kv_levers_on(policy_spec):
    """Under KV pressure with a host tier and the radix index on (a policy that never swaps still
    runs on an engine that has them), every invariant holds, the host tier's included."""
    for seed in (0, 1):
        scenario = pressure_scenario(seed)
        engine = dataclasses.replace(scenario.engine, host_kv_blocks=24, prefix_cache="radix")
        check_policy(policy_spec, dataclasses.replace(scenario, engine=engine))


def swap_every_victim(spec):
    """A factory of `spec`'s policy whose plans swap each preempted request whose computed blocks
    still fit the host tier (the rest recompute): swap preemption forced on a policy that never
    chose it, so its admission order meets swapped requests in `waiting`."""
    build = policy_factory(spec)

    def make():
        policy = build()
        decide = policy.schedule

        def schedule(view):
            plan = decide(view)
            room = view.num_free_host_blocks - sum(view.host_blocks_needed(view.by_id[r]) for r in plan.swap)
            for rid in plan.preempt:
                need = view.host_blocks_needed(view.by_id[rid])
                if rid not in plan.swap and need <= room:
                    plan.swap.append(rid)
                    room -= need
            return plan

        policy.schedule = schedule
        return policy
    return make


def test_invariants_with_swap_preemption_forced(policy_spec):
    """Every victim that fits the host tier is swapped, under both prefix indexes: every invariant
    holds, the swapped requests resume with exactly their tokens, and the swaps happen."""
    for index in ("hash", "radix"):
        swaps = preemptions = 0
        for seed in (0, 1):
            scenario = pressure_scenario(seed)
            engine = dataclasses.replace(scenario.engine, host_kv_blocks=48, prefix_cache=index)
            result = check_policy(swap_every_victim(policy_spec), dataclasses.replace(scenario, engine=engine))
            swaps += result.kv_tiers["swap_outs"]
            preemptions += sum(r.num_preemptions for r in result.requests)
        assert swaps > 0 or preemptions == 0, f"{index}: {preemptions} preemptions, none swapped"
