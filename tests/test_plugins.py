"""A launcher or sweeper that cannot run here is refused before Hydra starts, saying what to install."""
from __future__ import annotations

import importlib.util

import pytest

from policylab.apps import cli, plugins
from policylab.apps.config import CONFIG_DIR

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def without(monkeypatch):
    """Pretend the given plugin modules are not installed."""
    hidden = set()
    real = importlib.util.find_spec
    monkeypatch.setattr(plugins.importlib.util, "find_spec",
                        lambda name, *a: None if name in hidden else real(name, *a))
    return hidden


@pytest.mark.parametrize("arg,extra", [("hydra/launcher=ray", "ray"), ("hydra/launcher=joblib", "sweep"),
                                       ("hydra/launcher=submitit_local", "sweep"),
                                       ("hydra/sweeper=optuna", "sweep"), ("+experiment=optuna_chunk_size", "sweep")])
def test_a_missing_plugin_names_the_extra(without, capsys, arg, extra):
    without.update(m for m, _, _ in plugins.PLUGINS.values())
    with pytest.raises(SystemExit) as stop:
        cli.main(["run", "-m", arg, "dataplane=sim"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"pip install 'policylab[{extra}]'" in err and err.count("\n") == 1


def test_slurm_outside_a_slurm_cluster_says_why(monkeypatch):
    monkeypatch.setattr(plugins, "missing_plugin", plugins.missing_plugin)
    monkeypatch.setattr(plugins.importlib.util, "find_spec", lambda name, *a: object())
    monkeypatch.setenv("PATH", "/nonexistent")
    for option in ("submitit_slurm", "slurm"):
        why = plugins.check_plugins(["-m", f"hydra/launcher={option}"], CONFIG_DIR)
        assert "`sbatch` is not on PATH" in why and "submitit_local" in why


def test_installed_plugins_and_other_choices_pass(monkeypatch):
    monkeypatch.setattr(plugins.importlib.util, "find_spec", lambda name, *a: object())
    assert plugins.check_plugins(["-m", "hydra/launcher=joblib", "hydra/launcher=basic", "policy=chunked"],
                                 CONFIG_DIR) is None
    assert plugins.requested(["+experiment=optuna_chunk_size"], CONFIG_DIR) == [("sweeper", "optuna")]
