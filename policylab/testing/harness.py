"""Run a policy on the sim data plane under the invariant checker (DESIGN §8).

The engine is not modified: a recording proxy wraps the policy (it sees every view and
plan), another wraps the data plane (it sees every batch), and `CheckedEngine` overrides
only the public `step()` to hand the engine to the checker after each step.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.sim import SimDataPlane
from policylab.core.engine import Engine
from policylab.core.result import RunResult
from policylab.core.extensions.tool_calls import default_tool_kv
from policylab.testing.invariants import StepChecker
from policylab.testing.loader import policy_factory
from policylab.testing.session_invariants import check_sessions
from policylab.testing.properties import InvariantViolation


@dataclass(frozen=True)
class Scenario:
    """One generated case: a trace, an engine config (small KV, small budgets) and a seed."""

    trace: tuple
    engine: EngineConfig
    seed: int = 0
    prefix_block_tokens: int = 32
    sessions: object = None          # a SessionPlan over `trace`: replayed in closed loop (core.extensions.sessions)

    def describe(self) -> str:
        """One line: the requests in short, the engine settings that differ from the defaults, the seed."""
        t = self.trace
        span = f" over {max(r.arrival_time for r in t) - min(r.arrival_time for r in t):.3g} s" if t else ""
        lengths = (f" (prompts {min(r.prompt_tokens for r in t)}–{max(r.prompt_tokens for r in t)}, outputs "
                   f"{min(r.output_tokens for r in t)}–{max(r.output_tokens for r in t)} tokens)") if t else ""
        default = EngineConfig()
        engine = " ".join(f"{f.name}={getattr(self.engine, f.name)}" for f in dataclasses.fields(self.engine)
                          if getattr(self.engine, f.name) != getattr(default, f.name))
        return (f"{len(t)} request{'s' if len(t) != 1 else ''}{span}{lengths}; engine {engine or 'defaults'}; "
                f"seed {self.seed}"
                + ("; closed-loop sessions" if self.sessions is not None else ""))

    def _repr_pretty_(self, printer, cycle) -> None:
        """What hypothesis prints for a failing example: one line (the whole scenario is in the
        reproduction file a failure names)."""
        printer.text(f"Scenario(<{self.describe()}>)")


class _RecordingPolicy:
    """Forwards to the policy under test; hands every view and plan to the checker."""

    def __init__(self, inner, checker: "StepChecker"):
        self._inner, self._checker = inner, checker
        self.name = getattr(inner, "name", type(inner).__name__)
        self.features = tuple(getattr(inner, "features", ()))

    def schedule(self, view):
        self._checker.before_schedule(view)
        plan = self._inner.schedule(view)
        self._checker.after_schedule(view, plan)
        return plan

    def on_finished(self, view) -> None:
        hook = getattr(self._inner, "on_finished", None)
        if hook is not None:
            hook(view)

    def on_tool_call(self, view, request, call) -> str:
        return (getattr(self._inner, "on_tool_call", None) or default_tool_kv)(view, request, call)


class _RecordingDataPlane:
    def __init__(self, inner, checker: "StepChecker"):
        self._inner, self._checker = inner, checker
        self.vocab_size, self.eos_token_id = inner.vocab_size, inner.eos_token_id
        self.capabilities = inner.capabilities

    def __getattr__(self, name):      # the plane's other methods (num_kv_blocks, kv_block_bytes, export_kv, ...)
        return getattr(self._inner, name)

    def execute(self, batch):
        self._checker.batch = batch
        self._checker.check_writes(batch)
        return self._inner.execute(batch)


class CheckedEngine(Engine):
    def __init__(self, checker: "StepChecker", *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.checker = checker
        checker.engine = self

    def step(self) -> None:
        self.checker.begin_step()
        super().step()
        self.checker.end_step(self)

def _dataplane(seed: int) -> SimDataPlane:
    """The tiny model at a fixed 4 ms per step (as the policy scenarios): generated traces' arrivals
    then interleave with steps the same way whatever the roofline's fitted efficiencies."""
    return SimDataPlane(ModelConfig(), HardwareConfig(step_overhead=0.004), DataplaneConfig(kind="sim", cost_model="roofline"),
                        seed=seed)


def run_checked(policy, scenario: Scenario, max_steps: int | None = None,
                properties: bool = True) -> RunResult:
    """Replay `scenario` with `policy` (any spec the loader accepts), checking every step.

    Raises InvariantViolation naming the invariant; returns the RunResult otherwise.
    `properties=False` checks the engine-wide invariants only, not the policy's own promises.
    """
    instance = policy_factory(policy)()
    cfg = dataclasses.replace(scenario.engine, check_invariants=True)
    if max_steps is None:
        max_steps = 20 * sum(t.prompt_tokens + t.output_tokens for t in scenario.trace) + 1000
    checker = StepChecker(instance, cfg, scenario.trace, max_steps, properties)
    engine = CheckedEngine(checker, list(scenario.trace), _RecordingPolicy(instance, checker),
                           _RecordingDataPlane(_dataplane(scenario.seed), checker), cfg,
                           seed=scenario.seed, prefix_block_tokens=scenario.prefix_block_tokens,
                           sessions=scenario.sessions)
    result = engine.run()
    checker.finish(engine, result)
    if scenario.sessions is not None:
        check_sessions(result, scenario.sessions, checker.name)
    return result


def fingerprint(result: RunResult) -> tuple:
    """Everything a replay produced, comparable with ==."""
    reqs = tuple((r.status, r.reject_reason, tuple(r.output_ids), tuple(r.token_times),
                  r.first_scheduled_time, r.finish_time, r.num_preemptions, r.num_cached_tokens_total)
                 for r in result.requests)
    return reqs, tuple((k, tuple(v)) for k, v in sorted(result.steps.items())), result.status


FAILURES_DIR = "POLICYLAB_FAILURES"     # where reproduction files go (default: the temp dir's policylab-failures)


def reproduction(policy, scenario: Scenario) -> str:
    """Python that replays `scenario` under `policy` on its own (every field of the scenario spelled
    out: dataclass reprs evaluate back to equal objects)."""
    spec = policy if isinstance(policy, str) else f"{getattr(policy, '__module__', '?')}:" \
        f"{getattr(policy, '__qualname__', type(policy).__qualname__)}"
    return ("reproduce with:\n"
            "    from policylab.core.config import EngineConfig\n"
            "    from policylab.core.request import TraceRequest\n"
            "    from policylab.testing.harness import Scenario, check_policy\n"
            f"    check_policy({spec!r}, {scenario!r})")


def save_reproduction(policy, scenario: Scenario) -> Path:
    """The reproduction as a script (`python FILE` from the directory the policy imports from)."""
    code = reproduction(policy, scenario)
    script = "\n".join(line[4:] for line in code.splitlines()[1:]) + "\n"
    folder = Path(os.environ.get(FAILURES_DIR) or Path(tempfile.gettempdir()) / "policylab-failures")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"reproduce_{hashlib.sha256(script.encode()).hexdigest()[:12]}.py"
    path.write_text("# a failing invariant check of policylab's harness: python this file\n" + script)
    return path


def failure_report(error: BaseException, policy, scenario: Scenario) -> str:
    """The cause first (one line), then how to reproduce it and the scenario in one line; the
    scenario in full goes to a file."""
    try:
        where = f"python {save_reproduction(policy, scenario)}"
    except OSError as e:                # (an unwritable temp dir: the code itself, at the end)
        where = f"the code below (no file: {e})\n{reproduction(policy, scenario)}"
    return f"{error}\nreproduce: {where}\nscenario: {scenario.describe()}"


def check_policy(policy, scenario: Scenario, determinism: bool = True,
                 max_steps: int | None = None, properties: bool = True) -> RunResult:
    """All invariants of DESIGN §8 on one scenario, including same seed → identical results."""
    factory = policy_factory(policy)
    result = run_checked(factory, scenario, max_steps, properties)
    again = run_checked(factory, scenario, max_steps, properties) if determinism else result
    if fingerprint(again) != fingerprint(result):
        raise InvariantViolation("determinism", "two replays with the same seed differ",
                                 getattr(result, "policy", ""))
    return result
