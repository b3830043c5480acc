"""Which policylab policy a vLLM process runs: a policy config, named the way policylab names it.

vLLM builds the scheduler itself (in its engine process), so the choice travels as text:

- `POLICYLAB_POLICY=chunked` — a policy of configs/policy/ by name;
- `POLICYLAB_POLICY="chunked chunk_size=256 max_partial_prefills=2"` — the same, with overrides
  (values read as YAML: numbers, booleans, lists, `{a: 1}`);
- `POLICYLAB_POLICY=/path/policy.yaml` — a policy config file: a full `_target_` node as in
  configs/policy/, or `name: chunked` plus overrides.

Interpolations of the shipped configs (`${slo.ttft}`, `${fairness.w_in}`) take policylab's
defaults (`SloConfig`, `FairnessConfig`), or the values of `POLICYLAB_SLO_TTFT`-style variables.
"""
from __future__ import annotations

import importlib
import os
import re
from dataclasses import fields
from importlib.resources import files
from pathlib import Path

import yaml

from policylab.core.config import FairnessConfig, QoeConfig, SloConfig
from policylab.core.policy import Policy

POLICY_ENV = "POLICYLAB_POLICY"
DEFAULT_POLICY = "chunked"
_INTERPOLATION = re.compile(r"^\$\{(slo|fairness|qoe)\.(\w+)\}$")


class PolicyConfigError(ValueError):
    """A policy config that names no policy, an unknown parameter, or a bad value."""


def policy_dir() -> Path:
    checkout = Path(__file__).resolve().parents[3] / "configs" / "policy"
    return checkout if checkout.is_dir() else Path(str(files("policylab.configs"))) / "policy"


def policy_spec_from_env() -> str:
    return os.environ.get(POLICY_ENV, "").strip() or DEFAULT_POLICY


def resolve_spec(spec) -> dict:
    """A policy spec (name, 'name k=v ...', YAML path, or dict) as a `_target_` dict."""
    if isinstance(spec, dict):
        node = dict(spec)
    elif isinstance(spec, str) and (spec.endswith((".yaml", ".yml")) or os.sep in spec):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise PolicyConfigError(f"{POLICY_ENV}={spec}: no such policy config file")
        node = yaml.safe_load(path.read_text()) or {}
        if not isinstance(node, dict):
            raise PolicyConfigError(f"{path}: a policy config is a mapping (_target_ or name, parameters)")
    elif isinstance(spec, str):
        name, *pairs = spec.replace(",", " ").split()
        node = {"name": name}
        for pair in pairs:
            key, eq, value = pair.partition("=")
            if not eq or not key:
                raise PolicyConfigError(f"{POLICY_ENV}='{spec}': '{pair}' is not key=value")
            node[key] = yaml.safe_load(value)
    else:
        raise PolicyConfigError(f"a policy spec is a name, a YAML path or a dict, got {type(spec).__name__}")
    if "_target_" in node:
        return {k: _resolve(v) for k, v in node.items()}
    name = node.pop("name", None)
    known = sorted(p.stem for p in policy_dir().glob("*.yaml"))
    if not isinstance(name, str) or not (policy_dir() / f"{name}.yaml").is_file():
        raise PolicyConfigError(f"policy {name!r}: not a policy of configs/policy/ ({', '.join(known)}); "
                                "or give a config with _target_")
    base = yaml.safe_load((policy_dir() / f"{name}.yaml").read_text())
    unknown = [k for k in node if k not in base]
    if unknown:
        params = sorted(k for k in base if k not in ("_target_", "name"))
        raise PolicyConfigError(f"policy {name}: {unknown[0]} is not one of its parameters "
                                f"({', '.join(params) if params else 'it has none'})")
    base.update(node)
    return {k: _resolve(v) for k, v in base.items()}


def _resolve(value):
    if isinstance(value, str):
        m = _INTERPOLATION.match(value)
        if m:
            group, key = m.groups()
            defaults = {"slo": SloConfig(), "fairness": FairnessConfig(), "qoe": QoeConfig()}[group]
            if key not in {f.name for f in fields(defaults)}:
                raise PolicyConfigError(f"unknown interpolation {value}")
            env = os.environ.get(f"POLICYLAB_{group.upper()}_{key.upper()}")
            return float(env) if env else getattr(defaults, key)
    return value


def load_policy(spec) -> Policy:
    """The policy a spec names, built from its `_target_` with its parameters (a policy object
    is used as it is)."""
    if callable(getattr(spec, "schedule", None)):
        return spec
    node = resolve_spec(spec)
    target = node.pop("_target_")
    module, _, cls_name = str(target).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), cls_name)
    except (ImportError, AttributeError) as e:
        raise PolicyConfigError(f"policy _target_ {target}: cannot import it ({e})") from None
    try:
        policy = cls(**node)
    except TypeError as e:
        raise PolicyConfigError(f"policy {target}: {e}") from None
    if not callable(getattr(policy, "schedule", None)):
        raise PolicyConfigError(f"policy {target} has no schedule(view) method")
    return policy
