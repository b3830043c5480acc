"""The package's layers (DESIGN §10): each imports only downward, and nothing cycles.

Every import is read from the source, deferred ones inside functions included, so a lazy
import cannot hide an upward edge. `from A import b` is an edge to `A.b` when that is a
module and to `A` otherwise: importing a name a package's `__init__` re-exports runs that
`__init__`, and a cycle through it counts.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {               # package prefix -> layer; an import may only go to a lower layer or its own package
    "policylab.core": 0,
    "policylab": 1,                                   # the front door: re-exports the core's policy API
    "policylab.dataplane": 2, "policylab.traces": 2,
    "policies": 3, "policylab.integrations": 3,      # (integrations: vLLM driving core + data-plane configs)
    "policylab.cluster": 4,
    "policylab.analysis": 5,
    "policylab.testing": 6,
    "policylab.apps": 7,
    "policylab.__main__": 8,
    "policylab.examples": 8,                          # the documentation's example policies: user code on top
}
HEAVY = ("hydra", "omegaconf", "pandas", "torch", "matplotlib", "wandb", "pyarrow")


def modules() -> dict[str, Path]:
    found = {}
    for top in ("policylab", "policies"):
        for path in (ROOT / top).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def package_of(module: str) -> str:
    """The longest LAYERS prefix of `module` (its package, for the layer rule)."""
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len, default=None)
    assert best is not None, f"{module}: no layer declared for it in tests/test_layers.py LAYERS"
    return best


def imports(module: str, path: Path, known: dict) -> set[str]:
    out = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in out if m in known and m != module}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports(m, p, known) for m, p in known.items()}


def test_every_import_goes_down_a_layer_or_stays_in_its_package():
    upward = []
    for module, targets in graph().items():
        here = package_of(module)
        for t in targets:
            there = package_of(t)
            if there != here and LAYERS[there] >= LAYERS[here]:
                upward.append(f"{module} (layer {LAYERS[here]}) imports {t} (layer {LAYERS[there]})")
    assert not upward, "imports that do not go down a layer:\n" + "\n".join(sorted(upward))


def test_no_import_cycle():
    try:
        tuple(TopologicalSorter(graph()).static_order())
    except CycleError as e:
        raise AssertionError(f"import cycle: {' -> '.join(e.args[1])}") from None


def test_layer_rule_catches_a_planted_upward_import(tmp_path, monkeypatch):
    """The check itself can fail: a core module importing the app layer is reported."""
    fake = dict(modules())
    planted = tmp_path / "engine.py"
    planted.write_text("def f():\n    from policylab.apps.run import run\n")
    fake["policylab.core.engine"] = planted
    edges = imports("policylab.core.engine", planted, fake)
    assert edges == {"policylab.apps.run"}
    assert LAYERS[package_of("policylab.apps.run")] > LAYERS[package_of("policylab.core.engine")]


def test_the_engine_imports_without_hydra_pandas_torch_or_matplotlib():
    code = ("import sys, json; import policylab.core.engine, policylab.dataplane.sim, policylab.traces; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in %r)))" % (HEAVY,))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         timeout=120)
    assert json.loads(out.stdout) == [], "the core pulled in heavy modules"
