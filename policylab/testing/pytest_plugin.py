"""pytest plugin: `--policy=SPEC` runs the generic invariant suite on any policy.

    python -m pytest -p policylab.testing.pytest_plugin tests/test_invariants.py --policy=my_module:MyPolicy
    python -m pytest -p policylab.testing.pytest_plugin --pyargs policylab.testing.suite --policy=my.yaml

SPEC is 'module:Class', 'path/to/file.py:Class', a policy YAML (with `_target_`) or a
shipped config name; repeat the option to check several. Without it, every shipped policy
(configs/policy/*.yaml) is checked.
"""
from __future__ import annotations


def pytest_addoption(parser) -> None:
    group = parser.getgroup("policylab")
    group.addoption("--policy", action="append", default=[], metavar="SPEC",
                    help="policy for the invariant suite: module:Class, file.py:Class, a policy "
                         "YAML or a config name (repeatable; default: every configs/policy/*.yaml)")
