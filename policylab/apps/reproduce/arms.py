"""Measurements most reproductions share: each arm's capacity under a criterion on the same
workloads, and an arm's metric at fixed loads, both over the replicates.

`capacities` draws replicate k's workload once (`workload(k)`), then bisects each arm's load on
it: arms of one replicate are compared on the same requests (a paired comparison). A capacity
is reported in req/s: the highest `trace.rate_scale` that met the criterion times the
workload's own rate.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from policylab.apps.reproduce.entry import Panel
from policylab.apps.reproduce.runner import Context, write_workload
from policylab.apps.reproduce.stats import Measure, ratio


@dataclass
class ArmResults:
    """Per arm: one capacity (req/s) per replicate, and replicate 1's search rows for a curve."""
    capacity: dict = field(default_factory=dict)     # arm -> [req/s per replicate; None: below the searched range]
    curves: dict = field(default_factory=dict)       # arm -> [(rate req/s, summary, meets)] of replicate 1
    status: dict = field(default_factory=dict)       # arm -> [search status per replicate]

    def measure(self, arm: str, label: str = "") -> Measure:
        return Measure(label or f"capacity, {arm}", "req/s", self.capacity[arm])

    def gain(self, treated: str, baseline: str, label: str = "") -> Measure:
        return ratio(label or f"capacity {treated} / {baseline}", self.capacity[treated], self.capacity[baseline])


def capacities(ctx: Context, tag: str, base: list, arms: dict, workload: Callable[[int], list], rate: float,
               meets: Callable[[dict], bool], lo: float, hi: float, iters: int = 6,
               partial_misses: bool = False) -> ArmResults:
    """Each arm's capacity (req/s) on replicate k's workload for k = 1..ctx.replicates.

    `base`: overrides every arm shares (trace.path is added); `arms`: name -> its own overrides
    (a policy class among them is the arm's policy, its parameters `policy.*` overrides);
    `workload(k)`: replicate k's requests at `rate` req/s (rate_scale 1); `meets(summary)`: the
    criterion a load must meet; [lo, hi]: the rate_scale bracket (widened when outside it)."""
    out = ArmResults()
    for k in range(1, ctx.replicates + 1):
        path = write_workload(ctx.path(f"workloads/{tag}_r{k}.jsonl"), workload(k))
        for arm, own in arms.items():
            cls = next((o for o in own if isinstance(o, type)), None)      # a policy class, not a config name
            own = [o for o in own if not isinstance(o, type)]
            found = ctx.capacity([*base, "trace=file", f"trace.path={path}", *own], f"{tag}: {arm}", k, meets,
                                 lo, hi, iters, partial_misses=partial_misses, policy_class=cls)
            out.capacity.setdefault(arm, []).append(None if found.rate_scale is None else found.rate_scale * rate)
            out.status.setdefault(arm, []).append(found.status)
            if k == 1:
                out.curves[arm] = [(s * rate, summary, ok) for s, summary, ok in found.rows]
    return out


def curve_panel(title: str, ylabel: str, results: ArmResults, metric: Callable[[dict], float],
                bound: float | None = None, bound_label: str = "", log_y: bool = False) -> Panel:
    """A metric against the offered load (replicate 1's search), one line per arm."""
    lines = {arm: ([r for r, _, _ in rows], [metric(s) for _, s, _ in rows]) for arm, rows in results.curves.items()}
    return Panel(title, ylabel, lines=lines, xlabel="offered load (req/s)",
                 hlines={bound_label: bound} if bound is not None else {}, log_y=log_y)


def stat(summary: dict, section: str, field_: str = "") -> float:
    """A summary number, NaN when the run has none (no finished request)."""
    value = summary.get(section)
    if field_:
        value = (value or {}).get(field_)
    return float("nan") if value is None else float(value)
