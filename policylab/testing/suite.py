"""The generic invariant suite (DESIGN §8), parametrized over `policy_spec`.

`policy_spec` is each `--policy` given to pytest (with `-p policylab.testing.pytest_plugin`),
else every shipped policy config. Import this module's names into a test module (as
tests/test_invariants.py does) or collect it with `--pyargs policylab.testing.suite`.

A broken invariant or contract fails its test with the cause first, in one line, then the
command that reproduces it (the scenario in full goes to a file) and the scenario in one line;
an exception the policy raised keeps its traceback, with the same reproduction as a note.
"""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings

from policylab.core.config import EngineConfig
from policylab.core.request import TraceRequest
from policylab.core.extensions.tool_calls import ToolCall
from policylab.core.violation import ContractViolation
from policylab.testing.harness import Scenario, check_policy, failure_report
from policylab.testing.properties import InvariantViolation
from policylab.testing.loader import policy_factory, shipped_policy_configs, spec_id
from policylab.testing.strategies import scenarios


def pytest_generate_tests(metafunc) -> None:
    if "policy_spec" in metafunc.fixturenames:
        specs = metafunc.config.getoption("policy", default=None) or shipped_policy_configs()
        metafunc.parametrize("policy_spec", specs, ids=[spec_id(s) for s in specs])


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_invariants_on_generated_scenarios(policy_spec, scenario):
    checked(policy_spec, scenario)


def checked(policy_spec, scenario: Scenario, **options):
    """`check_policy`; a broken invariant or contract fails the test with its cause first."""
    try:
        return check_policy(policy_spec, scenario, **options)
    except (InvariantViolation, ContractViolation) as e:
        report = failure_report(e, policy_spec, scenario)
    except Exception as e:
        e.add_note(failure_report("the policy raised the exception above", policy_spec, scenario))
        raise
    pytest.fail(report, pytrace=False)


def pressure_scenario(seed: int) -> Scenario:
    """A fixed burst much larger than the KV cache: preemption and recompute are certain."""
    trace = tuple(TraceRequest(arrival_time=0.002 * (i // 6), prompt_tokens=40 + 17 * i % 90,
                               output_tokens=12 + 7 * i % 20, client=("a", "b")[i % 2], priority=i % 3,
                               prefix_hashes=(1,) if i % 3 == 0 else ())
                  for i in range(30))
    cfg = EngineConfig(block_size=8, num_blocks=40, max_num_batched_tokens=128, max_num_seqs=12)
    return Scenario(trace, cfg, seed=seed, prefix_block_tokens=32)


def check_each_seed(policy_spec, scenario_of) -> None:
    """`check_policy` on `scenario_of(seed)` for seeds 0 and 1; a failure names a file of code that
    reproduces it alone."""
    for seed in (0, 1):
        checked(policy_spec, scenario_of(seed))


def test_invariants_under_kv_pressure(policy_spec):
    """On failure the exception carries the scenario as code that reproduces it alone."""
    check_each_seed(policy_spec, pressure_scenario)


def test_invariants_with_kv_levers_on(policy_spec):
    """Under KV pressure with a host tier, the radix index and the prefix cache's host and disk
    tiers on (a policy that never swaps still runs on an engine that has them), every invariant
    holds, every tier's included."""
    for seed in (0, 1):
        scenario = pressure_scenario(seed)
        engine = dataclasses.replace(scenario.engine, host_kv_blocks=24, prefix_cache="radix",
                                     prefix_host_blocks=8, prefix_disk_blocks=8)
        checked(policy_spec, dataclasses.replace(scenario, engine=engine))


def forks_scenario(seed: int) -> Scenario:
    """The KV-pressure burst with parallel samples: 1 to 4 per request, each its own length."""
    base = pressure_scenario(seed)
    trace = tuple(dataclasses.replace(t, n=1 + i % 4, fork_output_tokens=tuple(3 + 5 * j + i % 7 for j in range(i % 4)))
                  for i, t in enumerate(base.trace))
    return dataclasses.replace(base, trace=trace)


def test_invariants_with_forks(policy_spec):
    """Parallel samples under KV pressure: reference counts equal the tables holding each block,
    no block is written while shared, nothing leaks at drain, every sample runs to its length."""
    check_each_seed(policy_spec, forks_scenario)


def beams_scenario(seed: int) -> Scenario:
    """The KV-pressure burst with beam search: widths 1 to 4, beams forked and replaced on the fly."""
    base = pressure_scenario(seed)
    return dataclasses.replace(base, trace=tuple(dataclasses.replace(t, beam_width=1 + (i + 1) % 4)
                                                 for i, t in enumerate(base.trace)))


def test_invariants_with_beams(policy_spec):
    """Beam search under KV pressure: beams share every block when they fork or are replaced by
    the best one, and every invariant of the forks holds."""
    check_each_seed(policy_spec, beams_scenario)


def tool_call_scenario(mode: str) -> Scenario:
    """KV pressure with requests that pause for tool calls (back-to-back calls and calls of no
    duration included), their KV handled as `mode` says (engine.tool_kv)."""
    trace = tuple(TraceRequest(arrival_time=0.003 * i, prompt_tokens=30 + 7 * i % 50, output_tokens=20 + 3 * i % 15,
                               client=("a", "b")[i % 2], priority=i % 3, prefix_hashes=(1,) if i % 3 == 0 else (),
                               tool_calls=(ToolCall(3, 0.01 * (i % 4), 9), ToolCall(4, 0.0, 1),
                                           ToolCall(10, 0.05, 20)) if i % 4 else ())
                  for i in range(24))
    cfg = EngineConfig(block_size=8, num_blocks=40, max_num_batched_tokens=128, max_num_seqs=12,
                       host_kv_blocks=24, tool_kv=mode)
    return Scenario(trace, cfg, prefix_block_tokens=32)


def test_invariants_with_tool_calls(policy_spec):
    """Every KV choice at a tool call (the policy's own, and each one forced) keeps every
    invariant, the paused requests' included."""
    for mode in ("policy", "keep", "free", "offload"):
        checked(policy_spec, tool_call_scenario(mode))


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
            result = checked(swap_every_victim(policy_spec), dataclasses.replace(scenario, engine=engine))
            swaps += result.sections["kv_tiers"]["swap_outs"]
            preemptions += sum(r.num_preemptions for r in result.requests)
        assert swaps > 0 or preemptions == 0, f"{index}: {preemptions} preemptions, none swapped"
