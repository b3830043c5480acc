"""pytest plugin: `--policy=SPEC` runs the generic invariant suite on any policy.

    python -m pytest -p policylab.testing.pytest_plugin --pyargs policylab.testing.suite \
        --policy=my_module:MyPolicy --hypothesis-profile=policylab-quick

SPEC is 'module:Class' (importable from the current directory), 'path/to/file.py:Class',
a policy YAML with `_target_`, or a shipped config name; repeat the option to check
several. Without it every shipped policy (configs/policy/*.yaml) is checked. Profiles
`policylab-quick` (20 examples per property) and `policylab-deep` (300) are registered
for `--hypothesis-profile`.
"""
from __future__ import annotations

from hypothesis import HealthCheck, settings

for _name, _examples in (("policylab-quick", 20), ("policylab-deep", 300)):
    settings.register_profile(_name, max_examples=_examples, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])


def pytest_addoption(parser) -> None:
    group = parser.getgroup("policylab")
    group.addoption("--policy", action="append", default=[], metavar="SPEC",
                    help="policy for the invariant suite: module:Class, file.py:Class, a policy "
                         "YAML or a config name (repeatable; default: every configs/policy/*.yaml)")
