"""Test-suite settings: hypothesis profiles (fast in CI, deep on demand).

HYPOTHESIS_PROFILE=deep python -m pytest   # hundreds of examples per property
"""
import os
import subprocess

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=15, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# `--policy=module:Class` (or a YAML / config name) runs the invariant suite on a user's policy
pytest_plugins = ["policylab.testing.pytest_plugin"]


@pytest.fixture
def tmpfs(tmp_path):
    """`tmpfs("100k")`: a folder on a small tmpfs of its own (a real full disk), unmounted after the
    test; the test is skipped where the machine does not let it mount one (root, Linux)."""
    mounted = []

    def mount(size: str):
        folder = tmp_path / f"tmpfs-{size}"
        folder.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True).returncode != 0:
            pytest.skip("cannot mount a small tmpfs here (needs root); an injected ENOSPC test covers it")
        mounted.append(folder)
        return folder
    yield mount
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=True)
