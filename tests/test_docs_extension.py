"""docs/design.md's engine sections as written: the worked extension of §12 runs as shown (its
class and declaration exec'd, its session checked as a doctest), the hook table of §2 is the
engine's HOOKS, and every file the design cites exists."""
from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

from policylab.core.extension import HOOKS
from policylab.core.features import FEATURES

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[1]
DESIGN = (ROOT / "docs" / "design.md").read_text()


def fenced(language: str, marker: str) -> str:
    """The first ```language block of the design that holds `marker`."""
    return next(b.split("```")[0] for b in DESIGN.split(f"```{language}\n")[1:] if marker in b.split("```")[0])


def test_the_worked_extension_runs_as_the_design_shows_it(monkeypatch):
    monkeypatch.setitem(FEATURES, "prompt_cap", None)      # the session declares it; undone after the test
    namespace: dict = {}
    exec(fenced("python", "class PromptCap"), namespace)
    session = fenced("pycon", ">>> result = Engine(")
    test = doctest.DocTestParser().get_doctest(session, namespace, "design.md §12", "docs/design.md", 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.failures == 0 and runner.tries >= 10, f"{runner.failures} of {runner.tries} examples failed"


def test_the_worked_extension_is_refused_in_a_run_with_the_feature_it_refuses(monkeypatch):
    """Declared in FEATURES, it is checked when an engine is built: with sessions it never runs."""
    from policies.chunked import Chunked
    from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
    from policylab.core.engine import Engine
    from policylab.core.extensions.sessions import SessionPlan
    from policylab.core.features import CombinationError
    from policylab.core.request import TraceRequest
    from policylab.dataplane.config import DataplaneConfig
    from policylab.dataplane.sim import SimDataPlane

    namespace: dict = {}
    exec(fenced("python", "class PromptCap"), namespace)
    monkeypatch.setitem(FEATURES, "prompt_cap", namespace["PROMPT_CAP"])
    trace = [TraceRequest(0.0, 100, 10)]
    plane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"))
    plan = SessionPlan.__new__(SessionPlan)                # the engine refuses before it reads the plan
    with pytest.raises(CombinationError, match="prompt_cap and sessions do not compose"):
        Engine(trace, Chunked(), plane, EngineConfig(num_blocks=64), extensions=[namespace["PromptCap"](50)],
               sessions=plan)


def test_the_hook_table_is_the_engines_hooks():
    table = DESIGN[DESIGN.index("### Extensions"):DESIGN.index("### Declared capabilities")]
    documented = re.findall(r"^\| `(\w+)\(", table, flags=re.M)
    assert documented[:len(HOOKS)] == list(HOOKS) and documented[len(HOOKS):] == ["section"], documented


def test_every_file_the_design_cites_exists():
    cited = set(re.findall(r"(?<![\w/.~-])((?:policylab|policies|tests|experiments|configs)/[\w/.-]*\w)", DESIGN))
    missing = [p for p in sorted(cited) if "NAME" not in p and not (ROOT / p).exists()
               and not (ROOT / f"{p}.py").exists() and not list(ROOT.glob(p + "*"))]
    assert cited and not missing, missing
    short = set(re.findall(r"(?<![\w/.-])((?:core|cluster)/[\w/]*\w(?:\.py)?)", DESIGN))   # the picture's
    assert short and not [p for p in short if not (ROOT / "policylab" / p).exists()], short
    modules = {m for m in re.findall(r"(?<![\w/.-])(\w+\.py)\b", DESIGN) if m != "NAME.py"}
    shipped = {f.name for d in ("policylab", "policies", "tests", "experiments") for f in (ROOT / d).rglob("*.py")}
    assert modules and not modules - shipped, modules - shipped
