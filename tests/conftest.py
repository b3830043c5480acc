"""Test-suite settings: hypothesis profiles (fast in CI, deep on demand).

HYPOTHESIS_PROFILE=deep python -m pytest   # hundreds of examples per property
"""
import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=15, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# `--policy=module:Class` (or a YAML / config name) runs the invariant suite on a user's policy
pytest_plugins = ["policylab.testing.pytest_plugin"]
