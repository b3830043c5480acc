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
                          capture_output=True, timeout=60).returncode != 0:
            pytest.skip("cannot mount a small tmpfs here (needs root); an injected ENOSPC test covers it")
        mounted.append(folder)
        return folder
    yield mount
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=True, timeout=60)


# ---- the two tiers ----------------------------------------------------------------------------
# `python -m pytest -m "not slow"` (the README's command) is the first tier: every layer, each
# policy under the invariant harness, each feature once. The second tier (`-m slow`; `.ci/run` and
# `python -m pytest` run both) repeats: every policy under every feature, every digest, deep
# hypothesis runs, every launcher and signal, the real-weights model, the docs site. A test marks
# itself `@pytest.mark.slow`; a test repeated over every shipped policy keeps its first-tier
# representatives here, the rest of its parameters go to the second tier.
FIRST_TIER_POLICIES = ("chunked", "prefill_first")
PER_POLICY = ("test_invariants_with_forks", "test_invariants_with_beams", "test_invariants_with_tool_calls",
              "test_invariants_with_swap_preemption_forced", "test_invariants_with_kv_levers_on",
              "test_the_cli_hands_engine_and_policy_only_plain_objects",
              "test_invariants_hold_with_fixed_k_under_every_shipped_policy")
FIRST_TIER_DIGESTS = ("/bursty",)          # a replay digest per policy on one trace; the other traces: second tier
FIRST_TIER_PARAMS = {                      # tests over cases of one mechanism: the first tier runs these cases
    "test_a_stop_signal_keeps_every_request_marked_partial": ("SIGTERM",),
    "test_kernels_match_dense_reference": ("dtype0-4-32-2", "dtype2-5-24-6"),
    "test_the_roofline_reproduces_results_recorded_before_the_shaped_default": ("chunked/poisson",),
    "test_invariants_hold_on_generated_fork_scenarios": ("chunked",),
    "test_cluster_job_is_identical": ("cli/1+2/round_robin/bursty-64", "cli/3/prefix_affinity/multitenant-64"),
    "test_compare_wandb_online_fails_with_one_sentence": ("not logged in-raises-None",),
}


def _second_tier(item) -> bool:
    name, params = getattr(item, "originalname", item.name), getattr(item, "callspec", None)
    key = params.id if params is not None else ""
    if name in PER_POLICY:
        return not any(key == p or key.endswith(f"/{p}.yaml") for p in FIRST_TIER_POLICIES)
    if name == "test_replay_is_identical":
        return not key.endswith(FIRST_TIER_DIGESTS)
    return name in FIRST_TIER_PARAMS and key not in FIRST_TIER_PARAMS[name]


def pytest_collection_modifyitems(config, items):
    import pytest
    for item in items:
        if _second_tier(item):
            item.add_marker(pytest.mark.slow)
