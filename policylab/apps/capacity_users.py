"""Capacity of a closed-loop workload: the most concurrent users at which SLO attainment holds.

In closed loop (a session trace, `trace.sessions=true`, or `trace.concurrency=N`) a request is
sent when an earlier one finishes, not at its recorded arrival time: compressing the arrival
times (`trace.rate_scale`) cannot raise the load, and a rate read off them means nothing. The
load is the number of users sending at once, so `capacity` searches it instead: one user, then
every session at once (the most the trace can put in flight), then a bisection on whole numbers
between them (geometric, as the rate's). The answer is a number of users and the request rate
they were served at (requests finished / makespan); the curve is attainment against users.
"""
from __future__ import annotations

import copy
import math
from typing import Callable, Optional

from policylab.apps.config import CapacityConfig

COLUMNS = ("users", "rate", "slo_attainment", "goodput", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99",
           "preemptions", "rejected", "replay_s", "status", "error")


def closed_loop_sessions(cfg) -> Optional[int]:
    """The sessions a closed-loop workload has (one-turn ones for `trace.concurrency` over an
    open-loop trace), or None when the trace is replayed at its arrival times."""
    import logging
    from policylab.traces import load_trace
    log = logging.getLogger("policylab.traces")
    level, log.level = log.level, logging.WARNING
    try:
        plan = getattr(load_trace(cfg.trace, seed=cfg.seed), "sessions", None)
    finally:
        log.setLevel(level)
    return None if plan is None else len(plan.firsts)


def search_users(evaluate: Callable[[int], dict], target: float, most: int) -> tuple:
    """(status, most users meeting `target`, rows in the order run): found | below_range (one
    user misses it) | above_range (all `most` at once meet it)."""
    rows: dict = {}

    def meets(users: int) -> bool:
        if users not in rows:
            rows[users] = evaluate(users)
            attainment = rows[users]["slo_attainment"]
            rows[users]["meets"] = attainment is not None and attainment >= target
        return rows[users]["meets"]

    if not meets(1):
        return "below_range", None, list(rows.values())
    if most <= 1 or meets(most):
        return "above_range", most, list(rows.values())
    lo, hi = 1, most
    while hi - lo > 1:
        mid = min(hi - 1, max(lo + 1, round(math.sqrt(lo * hi))))
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return "found", lo, list(rows.values())


def replay_users(cfg, users: int) -> dict:
    """Replay `cfg`'s closed-loop workload with `users` concurrent users: the curve's row."""
    from policylab.analysis.results import summarize_run
    from policylab.apps.settings import result_settings
    from policylab.apps.jobs import build_engine, replay
    cfg = copy.deepcopy(cfg)
    cfg.trace.concurrency = int(users)
    result = replay(build_engine(cfg), progress=False)
    summary = summarize_run(result, result_settings(cfg))[2]
    return {"users": int(users), "rate": summary["throughput"]["requests_per_s"],
            "slo_attainment": summary["slo_attainment"], "goodput": summary["goodput"],
            "ttft_p50": summary["ttft"]["p50"], "ttft_p99": summary["ttft"]["p99"],
            "tpot_p50": summary["tpot"]["p50"], "tpot_p99": summary["tpot"]["p99"],
            "preemptions": summary["preemptions"], "rejected": summary["counts"]["rejected"],
            "replay_s": summary["makespan"], "status": summary["status"], "error": summary["error"],
            "traceback": result.traceback}


def users_headline(status: str, users: Optional[int], rate: Optional[float], target: float, most: int) -> str:
    if status == "below_range":
        return f"the SLO is unreachable even with one user (target {target:.0%})"
    bound = "≥ " if status == "above_range" else ""
    rate_text = "" if rate is None or not math.isfinite(rate) else f", served {rate:.3f} req/s"
    more = f" (every one of the trace's {most} sessions at once)" if status == "above_range" else ""
    return f"{bound}{users} concurrent users{more}{rate_text}, at SLO attainment ≥ {target:.0%}"


def advice(status: str, rows: list, cap: CapacityConfig, most: int) -> str:
    """What the user can do when the search found no capacity inside its range."""
    if status == "below_range":
        best = max((r["slo_attainment"] for r in rows if r["slo_attainment"] is not None), default=None)
        return (f"  one user at a time already misses it: best SLO attainment seen "
                f"{'—' if best is None else f'{best:.1%}'} (target {cap.target:.0%}); fewer users cannot help: "
                "relax slo.ttft / slo.tpot or capacity.target")
    if status == "above_range":
        return (f"  all {most} sessions of the trace at once meet the SLO: a longer trace (more sessions, "
                "trace.max_requests) can load it further")
    return ""
