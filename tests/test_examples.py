"""The documentation's example policies, kept in policylab/examples/ where the shipped-policy tests never
see them: the first one fails the harness as docs/policies.md says, the Chunked-hooks one (the README's) passes it."""
from __future__ import annotations

import pytest

from policylab.examples.short_first import ShortFirst
from policylab.examples.shortest_prompt import ShortestPrompt
from policylab.testing import InvariantViolation, check_policy
from policylab.testing.loader import shipped_policy_configs
from policylab.testing.suite import pressure_scenario


def test_examples_are_not_shipped_policies():
    assert not [p for p in shipped_policy_configs() if "examples" in p or "short" in p]


def test_the_first_docs_example_fails_work_conservation():
    with pytest.raises(InvariantViolation, match="work_conservation|liveness"):
        for seed in range(3):
            check_policy(ShortestPrompt, pressure_scenario(seed), max_steps=3000)


@pytest.mark.parametrize("seed", range(3))
def test_chunked_hooks_example_passes_the_harness(seed):
    check_policy(ShortFirst, pressure_scenario(seed))
