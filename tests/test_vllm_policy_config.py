"""How a vLLM process is told which policylab policy to run (POLICYLAB_POLICY): no vLLM needed."""
import pytest

from policylab.integrations.vllm.policy_config import PolicyConfigError, load_policy, resolve_spec


def test_a_name_with_overrides_builds_that_policy_with_them():
    policy = load_policy("chunked chunk_size=256 max_partial_prefills=2")
    assert type(policy).__name__ == "Chunked" and policy.name == "chunked"
    assert resolve_spec("chunked,chunk_size=256")["chunk_size"] == 256


def test_shipped_interpolations_take_policylab_defaults_or_the_environment(monkeypatch):
    assert resolve_spec("slo_aware")["ttft_slo"] == 2.0
    monkeypatch.setenv("POLICYLAB_SLO_TTFT", "0.5")
    assert resolve_spec("slo_aware")["ttft_slo"] == 0.5
    assert resolve_spec("fairness")["w_out"] == 2.0


def test_a_config_file_names_a_policy_or_a_target(tmp_path):
    named = tmp_path / "p.yaml"
    named.write_text("name: decode_first\nadmit_into_free_slots: true\n")
    assert load_policy(str(named)).admit_into_free_slots is True
    target = tmp_path / "t.yaml"
    target.write_text("_target_: policies.prefill_first.PrefillFirst\nname: mine\n")
    assert load_policy(str(target)).name == "mine"


@pytest.mark.parametrize("spec, message", [
    ("nosuch", "not a policy of configs/policy/"),
    ("chunked chunk_sise=3", "chunk_sise is not one of its parameters"),
    ("chunked 256", "'256' is not key=value"),
    ("/no/such/file.yaml", "no such policy config file"),
])
def test_bad_specs_say_what_is_wrong(spec, message):
    with pytest.raises(PolicyConfigError, match=message):
        load_policy(spec)


def test_the_integration_imports_without_vllm_and_names_what_needs_it():
    import policylab.integrations.vllm as integration
    assert "PolicyScheduler" in integration.__all__


@pytest.mark.slow
def test_run_on_vllm_without_vllm_says_how_to_get_it(tmp_path):
    import importlib.util
    import os
    import subprocess
    import sys
    from pathlib import Path
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: tests/test_vllm_run.py runs the replay")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "policylab", "run", "dataplane=vllm", "logger=none",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: dataplane=vllm needs vLLM in this Python")
