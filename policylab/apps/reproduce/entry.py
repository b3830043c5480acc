"""What one reproduction is: the paper, its headline claim, its setting, ours, every substitution,
and the measurement that turns replays into a number to set beside the paper's.

An entry's `measure(ctx)` runs its replays through the context (`runner.Context`) and returns
an `Outcome`: the paper's numbers beside the replay's (`Comparison`s), supporting measures, a
verdict and the figure's data. An entry that needs a lever the engine does not
have yet (`requires`) is listed with its planned setting and runs nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from policylab.apps.reproduce.stats import Measure, Verdict  # noqa: F401 (Outcome's parts)


@dataclass(frozen=True)
class Paper:
    title: str
    venue: str
    url: str


@dataclass(frozen=True)
class Claim:
    text: str                       # the paper's headline claim, one sentence
    value: Optional[float]          # its number (a ratio: 2.6 for "2.6×"); None: a bound or a shape
    source: str                     # where the number is stated (abstract, artifact, ...)


@dataclass
class Panel:
    """One panel of an entry's figure: `bars` (label -> Measure) or `lines` (label -> (xs, ys))."""
    title: str
    ylabel: str
    bars: dict = field(default_factory=dict)
    lines: dict = field(default_factory=dict)
    xlabel: str = ""
    hlines: dict = field(default_factory=dict)      # label -> y (a bound, an SLO)
    log_y: bool = False


@dataclass(frozen=True)
class Comparison:
    """One of the paper's numbers beside the replay's."""
    label: str                      # what is compared ("capacity gain, Mistral-7B on 1xA100")
    paper: Optional[float]          # the paper's number (None: the paper gives a bound or a shape)
    ours: Measure
    paper_text: str = ""            # how the paper states it ("2.6×", "≤ 2U")


@dataclass
class Outcome:
    comparisons: list               # Comparisons: the paper's numbers beside the replay's
    verdict: Verdict
    measures: list                  # supporting Measures (each arm's number, hit rates, ...)
    panels: list                    # the figure
    notes: list = field(default_factory=list)       # what the reader should know about this replay


@dataclass(frozen=True)
class Entry:
    name: str                       # `python -m policylab reproduce NAME`
    title: str
    paper: Paper
    claim: Claim
    paper_setting: str              # model, GPU, parallelism, workload, SLOs as the paper ran them
    replay_setting: str             # what the replay runs
    substitutions: tuple            # each difference from the paper's setting, one sentence each
    measure: Optional[Callable] = None      # measure(ctx) -> Outcome
    requires: tuple = ()            # levers the engine must have (e.g. "migration")
    planned: str = ""               # for an entry waiting on a lever: the setting it will replay

    def missing_levers(self) -> tuple:
        from policylab.apps.reproduce.levers import available
        return tuple(lever for lever in self.requires if not available(lever))

    @property
    def command(self) -> str:
        return f"python -m policylab reproduce {self.name}"
