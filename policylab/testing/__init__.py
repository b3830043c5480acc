"""Invariant harness: check any scheduling policy against DESIGN §8 on the sim data plane.

    from policylab.testing import Scenario, check_policy
    check_policy("configs/policy/chunked.yaml", scenario)    # raises InvariantViolation

A policy spec is a Policy class or instance, a factory, a `_target_` config dict, a YAML
path, 'module:Class' or a shipped config name. Hypothesis strategies for scenarios are in
`policylab.testing.strategies` (needs hypothesis); the pytest plugin
`policylab.testing.pytest_plugin` adds `--policy=SPEC` to run the generic suite
(`policylab.testing.suite`, collected by tests/test_invariants.py) on any policy.
"""
from policylab.testing.harness import Scenario, check_policy, fingerprint, run_checked
from policylab.testing.loader import PolicySpecError, load_policy, policy_factory, shipped_policy_configs
from policylab.testing.properties import PROPERTIES, InvariantViolation

__all__ = ["Scenario", "check_policy", "run_checked", "fingerprint", "InvariantViolation",
           "PROPERTIES", "PolicySpecError", "load_policy", "policy_factory", "shipped_policy_configs"]
