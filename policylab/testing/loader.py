"""Turn anything that names a policy into a factory of fresh policy instances.

Each replay needs a fresh instance (policies keep state, e.g. VTC counters), so the harness
works with factories. Accepted specs: a Policy subclass; a Policy instance (deep-copied per
run); a zero-argument callable returning a policy; a Hydra config dict with `_target_`;
a YAML file path; 'module:Attr' or 'path/to/file.py:Attr'; a name under configs/policy.
YAML interpolations such as ${slo.ttft} resolve against the default run config.
"""
from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import sys
from dataclasses import asdict
from importlib.resources import files
from pathlib import Path
from typing import Callable

from policylab.core.config import FairnessConfig, QoeConfig, SloConfig

CONFIG_DIR = Path(str(files("policylab.configs")))   # the repository's configs/, shipped in the wheel
POLICY_CONFIG_DIR = CONFIG_DIR / "policy"


class PolicySpecError(ValueError):
    """A policy spec that cannot be turned into a policy (says what was expected)."""


def shipped_policy_configs() -> list:
    """Every policy YAML the project ships (configs/policy/*.yaml), sorted."""
    return sorted(str(p) for p in POLICY_CONFIG_DIR.glob("*.yaml"))


def policy_factory(spec) -> Callable:
    """A zero-argument callable that builds a fresh policy from `spec` (see module doc)."""
    if isinstance(spec, str):
        return policy_factory(_resolve_string(spec))
    if inspect.isclass(spec):
        factory = spec
    elif callable(getattr(spec, "schedule", None)):
        factory = lambda: copy.deepcopy(spec)   # noqa: E731 - an instance: copy per run
    elif _is_mapping(spec):
        factory = lambda: _instantiate(spec)    # noqa: E731
    elif callable(spec):
        factory = spec
    else:
        raise PolicySpecError(f"cannot build a policy from {spec!r}: expected a Policy class or "
                              "instance, a factory, a config dict with _target_, a YAML path or "
                              "'module:Class'")
    return lambda: _checked(factory(), spec)


def load_policy(spec):
    """One fresh policy instance from `spec`."""
    return policy_factory(spec)()


def spec_id(spec) -> str:
    """Short readable id of a spec (for test ids)."""
    if isinstance(spec, str):
        return Path(spec.split(":")[0]).stem if spec.endswith((".yaml", ".yml")) else spec
    return getattr(spec, "__name__", type(spec).__name__)


def _checked(policy, spec):
    if not callable(getattr(policy, "schedule", None)):
        raise PolicySpecError(f"{spec!r} built {type(policy).__name__}, which has no schedule(view) method")
    return policy


def _is_mapping(spec) -> bool:
    from omegaconf import DictConfig
    return isinstance(spec, (dict, DictConfig))


def _resolve_string(spec: str):
    path = Path(spec)
    if spec.endswith((".yaml", ".yml")):
        return _load_yaml(path)
    if ":" in spec:
        module_name, _, attr = spec.rpartition(":")
        module = _import(module_name)
        if not hasattr(module, attr):
            raise PolicySpecError(f"policy spec '{spec}': module '{module_name}' has no attribute '{attr}'")
        return getattr(module, attr)
    named = POLICY_CONFIG_DIR / f"{spec}.yaml"
    if named.exists():
        return _load_yaml(named)
    raise PolicySpecError(f"policy spec '{spec}': expected 'module:Class', 'file.py:Class', a YAML "
                          f"path, or one of {[Path(p).stem for p in shipped_policy_configs()]}")


def _import(name: str):
    if name.endswith(".py"):
        path = Path(name)
        if not path.exists():
            raise PolicySpecError(f"policy file '{name}' does not exist")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))       # `pytest --policy=my_module:X` from the project dir
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise PolicySpecError(f"cannot import policy module '{name}': {e}") from None


def _load_yaml(path: Path):
    from omegaconf import OmegaConf
    if not path.exists():
        raise PolicySpecError(f"policy config '{path}' does not exist")
    node = OmegaConf.load(path)
    if "_target_" not in node:
        raise PolicySpecError(f"policy config '{path}': missing '_target_' (the policy class to build)")
    return node


def _instantiate(cfg):
    """Build a policy from a `_target_` config, resolving ${slo.*}/${fairness.*}/${qoe.*} like a run does."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    root = OmegaConf.create({"slo": asdict(SloConfig()), "fairness": asdict(FairnessConfig()), "qoe": asdict(QoeConfig()),
                             "policy": OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg})
    try:
        return instantiate(root.policy)
    except Exception as e:
        shown = OmegaConf.to_container(root.policy)
        raise PolicySpecError(f"cannot build policy from {shown}: {e}") from None
