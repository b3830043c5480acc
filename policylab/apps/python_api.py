"""`policylab.replay(...)` and `policylab.compare(...)`: the command line's jobs, from Python.

A notebook wants the same runs the CLI makes, with the same config groups and keys, and the
results as objects. `replay` composes the config with Hydra's compose API from the CLI's own
config directory (so `replay(policy="chunked", trace="bursty", dataplane="sim")` is
`python -m policylab run policy=chunked trace=bursty dataplane=sim`), runs the same job,
writes the same run directory (plus `.hydra/overrides.yaml`, which `compare` reads to label
runs) and returns a `Run` over it. `compare` is the `compare` command, returning its table.

Overrides are keyword arguments: `trace__rate_scale=3` or `**{"trace.rate_scale": 3}` (a
`__` is a dot), a dict for a whole section (`engine={"max_num_seqs": 64}`), or Hydra
override strings as positional arguments (`"trace.rate_scale=3"`). A policy may be a name
of configs/policy/ or a class; a class's constructor arguments are `policy.*` overrides.
"""
from __future__ import annotations

import inspect
import re
import sys
from importlib import import_module
from pathlib import Path

from policylab.apps.jobs import RunError
from policylab.apps.run_object import Run

SIMPLE_VALUE = re.compile(r"^[\w.:/+\-@~]+$")
POLICY_CLASSES: dict = {}        # "module.qualname" -> class, for classes no import can reach (a notebook cell's)


def replay(policy=None, trace=None, *args: str, dir=None, verbose: bool = False, **overrides) -> Run:
    """Replay `trace` under `policy` as `python -m policylab run` does, and return the `Run`.

    policy: a name of configs/policy/ (`"chunked"`) or a `Policy` subclass (its constructor
    arguments: `policy__chunk_size=256` or `**{"policy.chunk_size": 256}`); None for the
    default. trace: a name of configs/trace/ (None: the default). args: Hydra override
    strings. dir: the run directory (default: outputs/<date>/<time>-<pid>_<policy>_<trace>,
    as the CLI's). verbose: print the CLI's end-of-run summary; by default a replay shows
    only a progress bar that goes away when it ends (and any warning). Any other keyword is a
    config key or group: `dataplane="sim"`,
    `trace__rate_scale=3`, `engine={"max_num_seqs": 64}`. Raises `ConfigError` (a key or
    value the config does not have) or `RunError`; a replay that ends partial (a broken
    contract) returns its Run with `status == "partial"` and `error` set.
    """
    from policylab.apps.config import typed_config
    from policylab.apps.jobs import set_aside_previous_results
    from policylab.apps.run import run

    flat = _flatten(overrides)
    policy_class = policy if isinstance(policy, type) else None
    if policy is not None and policy_class is None and not isinstance(policy, str):
        raise RunError(f"policy must be a name of configs/policy/ or a Policy class, got {policy!r}")
    class_params = {k.split(".", 1)[1]: v for k, v in flat.items() if policy_class and k.startswith("policy.")}
    strings = list(args)
    if isinstance(policy, str):
        strings.append(f"policy={policy}")
    if trace is not None:
        strings.append(f"trace={trace}")
    strings += [f"{k}={_hydra_value(v)}" for k, v in flat.items()
                if not (policy_class and k.startswith("policy."))]
    cfg = compose(strings, policy_class, class_params)
    run_dir = Path(dir) if dir is not None else Path(cfg.hydra.run.dir)
    recorded = [*strings, *(f"policy.{k}={_hydra_value(v)}" for k, v in class_params.items())]
    from omegaconf import open_dict
    with open_dict(cfg):
        del cfg["hydra"]
    typed = typed_config(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    set_aside_previous_results(run_dir)
    _write_hydra_files(run_dir, cfg, recorded)
    summary = run(typed, run_dir, verbose=verbose)
    return Run(run_dir, summary)


def compare(runs_or_dirs, out=None, verbose: bool = False):
    """The `compare` command over runs (`Run` objects) or directories (runs or sweeps): writes
    its report (compare.md, compare.html, CSVs, figures) into `out` (default: the first
    directory's `compare/`), prints its findings and warnings (`verbose`: the whole printout,
    the table included) and returns the grouped table as a DataFrame, one row per
    configuration and load: each metric's mean over the replicates and its 95 % interval (the
    `... low` and `... high` columns, inside the metric's limits; `... ±` is half its width).
    The report's path is in the DataFrame's `attrs["report"]`, the findings (one sentence per
    metric on which the pairwise tests separate configurations) in `attrs["findings"]`."""
    import pandas as pd
    from policylab.analysis.compare import main as compare_main

    items = list(runs_or_dirs) if isinstance(runs_or_dirs, (list, tuple)) else [runs_or_dirs]
    paths = [str(r.dir if isinstance(r, Run) else r) for r in items]
    if not paths:
        raise RunError("compare: no runs given")
    out = Path(out) if out is not None else Path(paths[0]) / "compare"
    code = compare_main([*paths, "-o", str(out)], verbose=verbose)
    if code:
        raise RunError(f"compare of {' '.join(paths)} failed (exit status {code}; its message is above)")
    table = pd.read_csv(out / "compare.csv")
    table.attrs["report"] = out / "compare.md"
    findings = out / "findings.txt"
    table.attrs["findings"] = findings.read_text().splitlines() if findings.is_file() else []
    return table


def compose(strings: list, policy_class=None, class_params: dict | None = None):
    """The run config the CLI would compose from these overrides (hydra's own node included,
    for the run directory), with the policy group replaced by `policy_class` when one is given."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException
    from policylab.apps.config import CONFIG_DIR, ConfigError, register

    register()
    if GlobalHydra.instance().is_initialized():
        raise RunError("policylab.replay composes its own config: call it outside a running Hydra app")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3", job_name="policylab"):
        try:
            cfg = hydra_compose("config", overrides=strings, return_hydra_config=True)
        except (HydraException, OmegaConfBaseException) as e:
            raise ConfigError(_compose_error(str(e), strings, hydra_compose)) from None
    if policy_class is not None:
        with open_dict(cfg):
            cfg.policy = OmegaConf.create(policy_spec(policy_class, class_params or {}))
    return cfg


def _compose_error(message: str, strings: list, hydra_compose) -> str:
    """Hydra's first line, or for a key no section has, the key and the nearest one it does have."""
    from difflib import get_close_matches
    unknown = re.match(r"Could not override '([\w.]+)'", message)
    if unknown and "." in unknown.group(1):
        key = unknown.group(1)
        section, _, leaf = key.rpartition(".")
        rest = [o for o in strings if not o.startswith(f"{key}=")]
        try:
            node = hydra_compose("config", overrides=rest)
            for part in section.split("."):
                node = node[part]
            close = get_close_matches(leaf, list(node.keys()), n=1)
        except Exception:                   # (the rest fails too: Hydra's own message says why)
            close = []
        return f"config: {key} is not a key of {section}" + (f" (did you mean {section}.{close[0]}?)" if close else "")
    return f"config: {message.splitlines()[0]}"


def policy_spec(cls: type, params: dict) -> dict:
    """The policy group node of a class: `policy_from_class` builds it, so a class that only
    this process can reach (defined in a notebook cell, or in a function) works as well as an
    importable one; the spec records which class ran."""
    if not callable(getattr(cls, "schedule", None)):
        raise RunError(f"policy {cls.__name__} has no schedule(view) method")
    path = f"{cls.__module__}.{cls.__qualname__}"
    if _importable(path) is not cls:
        POLICY_CLASSES[path] = cls
    return {"_target_": f"{__name__}.policy_from_class", "policy_class": path,
            "name": params.pop("name", None) or cls.__name__, **params}


def policy_from_class(policy_class: str, name: str, **params):
    """Build the policy `policy_spec` named (the `_target_` of a class-policy config)."""
    cls = POLICY_CLASSES.get(policy_class) or _importable(policy_class)
    if cls is None:
        raise RunError(f"policy class {policy_class} cannot be imported in this process")
    accepts_name = "name" in inspect.signature(cls).parameters
    policy = cls(name=name, **params) if accepts_name else cls(**params)
    if not accepts_name and getattr(policy, "name", None) in (None, type(policy).__name__):
        policy.name = name
    return policy


def _importable(path: str):
    """The object a dotted `module.Qual.Name` path reaches by import, or None."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = sys.modules.get(".".join(parts[:i])) or import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr, None)
        return obj
    return None


def _flatten(overrides: dict, prefix: str = "") -> dict:
    """Keyword overrides as {"dotted.key": python value}: `__` is a dot, a dict nests."""
    flat = {}
    for key, value in overrides.items():
        key = prefix + key.replace("__", ".")
        if isinstance(value, dict):
            flat.update(_flatten(value, key + "."))
        else:
            flat[key] = value
    return flat


def _hydra_value(value) -> str:
    """A Python value in Hydra's override grammar (strings quoted where the grammar would split them)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    if isinstance(value, Path):
        value = str(value)
    if not isinstance(value, str):
        raise RunError(f"override value {value!r}: expected a number, string, bool, None, list or dict")
    if SIMPLE_VALUE.match(value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _write_hydra_files(run_dir: Path, cfg, overrides: list) -> None:
    """What a CLI run leaves in .hydra/: the composed config and the overrides (compare's labels)."""
    import yaml
    from omegaconf import OmegaConf
    hydra_dir = run_dir / ".hydra"
    hydra_dir.mkdir(parents=True, exist_ok=True)
    (hydra_dir / "overrides.yaml").write_text(yaml.safe_dump(list(overrides), sort_keys=False))
    (hydra_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
