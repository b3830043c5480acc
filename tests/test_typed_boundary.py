"""The app layer hands every layer below plain typed objects, never an OmegaConf node (DESIGN §2:
the engine reads its config on every step; a node read costs a resolver call)."""
from __future__ import annotations

import dataclasses

import pytest
from omegaconf import Container

import policylab.apps.engine_build as engine_build
from policylab.apps.cli import main
from policylab.core.config import EngineConfig
from policylab.testing import shipped_policy_configs

POLICIES = [p.rsplit("/", 1)[-1].removesuffix(".yaml") for p in shipped_policy_configs()]


def omegaconf_nodes(obj, path="", seen=None) -> list[str]:
    """Paths inside `obj` (attributes, dict values, list items) that hold an OmegaConf container."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return []
    seen.add(id(obj))
    if isinstance(obj, Container):
        return [path or "<root>"]
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple, set)):
        items = enumerate(obj)
    elif dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__"):
        items = vars(obj).items()
    else:
        return []
    return [p for k, v in items for p in omegaconf_nodes(v, f"{path}.{k}", seen)]


def test_the_walker_finds_a_planted_node():
    from omegaconf import OmegaConf
    assert omegaconf_nodes({"a": [1, {"b": OmegaConf.create({"x": 1})}]}) == [".a.1.b"]


@pytest.mark.parametrize("policy", POLICIES)
def test_the_cli_hands_engine_and_policy_only_plain_objects(policy, tmp_path, monkeypatch):
    handed = {}

    class Recorder(engine_build.Engine):
        def __init__(self, trace, policy, dataplane, cfg, **kw):
            handed.update(policy=policy, cfg=cfg, trace=trace, kw=kw)
            super().__init__(trace, policy, dataplane, cfg, **kw)

    monkeypatch.setattr(engine_build, "Engine", Recorder)
    main(["run", f"policy={policy}", "dataplane=sim", "logger=none", "plots=false", "progress=false",
          "trace.max_requests=5", f"hydra.run.dir={tmp_path}"])
    assert type(handed["cfg"]) is EngineConfig
    assert omegaconf_nodes(handed) == []
