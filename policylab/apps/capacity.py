"""`python -m policylab capacity policy=... trace=... slo.ttft=... target=0.9`: serving capacity.

Capacity (DistServe, Sarathi-Serve) is the highest arrival rate at which SLO attainment
stays ≥ a target. The trace is replayed at several `trace.rate_scale` values (tracking
off, same seed): first the bracket ends `lo` and `hi`, then `iters` bisection steps on a
log scale (rates span orders of magnitude); a bracket that misses the capacity is moved
by its own width up to `widen` times first. Attainment is assumed to fall as load rises.

A short replay measures a transient: queues have not built up yet, so a rate the system cannot
sustain still looks served. With `capacity.sustain` (the default) every replay is tiled
(`trace.repeat`) until its arrivals span `capacity.min_replay_s`, and the capacity found is
replayed again over twice that span; if it no longer meets the target, the span doubles and
the search runs again (`capacity.steady_rounds` times at most). The result says over which
span the capacity held (`steady_span_s`) and the bisection interval it lies in.
The job writes capacity.json, the curve as capacity.csv, and capacity.png into its
Hydra output directory, and returns the capacity in req/s (an objective for sweepers).

A closed-loop workload (sessions, `trace.concurrency`) has no arrival rate to scale: its
capacity is a number of concurrent users, searched by `capacity_users`. A target missed even at
the lowest load says so, with the best attainment seen, instead of asking for a lower bracket.
"""
from __future__ import annotations

import copy
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from policylab.apps.capacity_users import advice, closed_loop_sessions, replay_users, search_users, users_headline
from policylab.apps.config import CapacityConfig, run_policy_label, typed_config
from policylab.apps.jobs import RunError, build_engine, expand_shorthands, guarded_job, replay
from policylab.apps.jobs import write_traceback

if TYPE_CHECKING:
    import pandas as pd


SHORTHANDS = ("target", "lo", "hi", "iters", "widen")    # `target=0.9` means `capacity.target=0.9`
RUN_DIR = "hydra.run.dir=outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}-${policylab_pid:}_capacity_${policylab_policy:}_${trace.name}"


@dataclass
class CapacityResult:
    status: str                     # found | below_range | above_range
    rate_scale: Optional[float]     # highest scale tried that met the target (None: none did)
    rate: Optional[float]           # that scale's arrival rate, req/s
    target: float
    curve: pd.DataFrame             # one row per evaluated scale, sorted by rate
    steady_span_s: Optional[float] = None   # arrivals span over which the capacity held (and over 2x)
    users: Optional[int] = None     # closed loop: most concurrent users meeting the target
    most_users: Optional[int] = None   # closed loop: the trace's sessions (all of them at once)

    @property
    def interval(self) -> tuple:
        """(highest passing, lowest failing above it): rates in req/s, or users in closed loop."""
        c = self.curve
        if self.most_users is not None:
            above = c[(c["users"] > (self.users or 0)) & ~c["meets"]]["users"]
            return self.users, (int(above.min()) if len(above) else None)
        passed = None if self.rate_scale is None else self.rate
        above = c[(c["rate_scale"] > (self.rate_scale or 0)) & ~c["meets"]]["rate"]
        return passed, (above.min() if len(above) else None)


def search(evaluate: Callable[[float], dict], cap: CapacityConfig) -> tuple[str, Optional[float], list]:
    """Bisection on rate_scale; `evaluate(scale)` returns a row with `slo_attainment`.

    Returns (status, best passing scale, evaluated rows in the order they were run).
    """
    if not 0 < cap.lo < cap.hi:
        raise ValueError(f"capacity: need 0 < lo < hi, got lo={cap.lo} hi={cap.hi}")
    rows: dict = {}

    def meets(scale: float) -> bool:
        if scale not in rows:
            rows[scale] = evaluate(scale)
        attainment = rows[scale]["slo_attainment"]
        rows[scale]["meets"] = attainment is not None and attainment >= cap.target
        return rows[scale]["meets"]

    lo, hi, factor = cap.lo, cap.hi, cap.hi / cap.lo
    for _ in range(cap.widen):
        if not meets(lo):
            lo, hi = lo / factor, lo
        elif meets(hi):
            lo, hi = hi, hi * factor
        else:
            break
    if not meets(lo):
        return "below_range", None, list(rows.values())
    if meets(hi):
        return "above_range", hi, list(rows.values())
    for _ in range(cap.iters):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return "found", lo, list(rows.values())


def replay_at(cfg, scale: float, min_span: float = 0.0) -> dict:
    """Replay `cfg`'s trace at `rate_scale=scale`, tiled until its arrivals span `min_span`
    seconds: rate and the metrics the curve needs."""
    from policylab.analysis.results import summarize_run
    from policylab.apps.settings import result_settings
    cfg = copy.deepcopy(cfg)
    cfg.trace.rate_scale = float(scale)
    tiles, rate = tiles_and_rate(cfg, min_span)
    cfg.trace.repeat *= tiles
    engine = build_engine(cfg)
    result = replay(engine, progress=False)
    summary = summarize_run(result, result_settings(cfg))[2]
    return {"rate_scale": float(scale), "rate": rate,
            "slo_attainment": summary["slo_attainment"], "goodput": summary["goodput"],
            "ttft_p50": summary["ttft"]["p50"], "ttft_p99": summary["ttft"]["p99"],
            "tpot_p50": summary["tpot"]["p50"], "tpot_p99": summary["tpot"]["p99"],
            "preemptions": summary["preemptions"], "rejected": summary["counts"]["rejected"],
            "replay_s": summary["makespan"], "repeat": cfg.trace.repeat,
            "status": summary["status"], "error": summary["error"], "traceback": result.traceback}


def tiles_and_rate(cfg, min_span: float) -> tuple:
    """(times to tile `cfg`'s trace at its rate_scale for its arrivals to span `min_span` s, its
    arrival rate in req/s): the rate is the trace's own, the same however often it is tiled."""
    import logging
    from policylab.traces import load_trace
    log = logging.getLogger("policylab.traces")
    level, log.level = log.level, logging.WARNING        # (the replay itself reports the trace it reads)
    try:
        arrivals = [t.arrival_time for t in load_trace(cfg.trace, seed=cfg.seed)]
    finally:
        log.setLevel(level)
    span = max(arrivals) - min(arrivals) if arrivals else 0.0
    if span <= 0:
        return 1, None
    period = span * len(arrivals) / max(len(arrivals) - 1, 1)      # a tile starts one mean gap after the last
    return max(1, math.ceil(min_span / period)) if min_span > 0 else 1, len(arrivals) / span


def find_capacity(cfg, cap: CapacityConfig, out_dir: Path,
                  evaluate: Optional[Callable[[float, float], dict]] = None) -> CapacityResult:
    """Search (until steady, with `cap.sustain`), then write capacity.json, capacity.csv and
    capacity.png into `out_dir`. `evaluate(scale, min_span)` stands in for a replay."""
    cfg = typed_config(cfg)
    import pandas as pd
    from policylab.analysis.plots import save
    rows_so_far = []
    span = cap.min_replay_s if cap.sustain else 0.0
    sessions = closed_loop_sessions(cfg)
    if sessions is not None:
        print(f"  closed loop: requests follow completions, not arrival times; searching the concurrent users "
              f"(trace.concurrency, 1 to {sessions}) instead of trace.rate_scale", file=sys.stderr)

    def logged(scale: float) -> dict:
        if sessions is not None:
            row = (evaluate or (lambda u, m: replay_users(cfg, u)))(scale, 0.0)
        else:
            row = (evaluate or (lambda s, m: replay_at(cfg, s, m)))(scale, span)
        trace_text = row.pop("traceback", "")
        where = f"users {scale:6d}" if sessions is not None else f"rate_scale {scale:8.4f}"
        print(f"  {where}: {_fmt(row['rate'], '.3f')} req/s, SLO attainment "
              f"{_fmt(row['slo_attainment'], '.1%')}, p99 TTFT {_fmt(row['ttft_p99'], '.3f')} s"
              + (f"  [{row['status']}: {row['error']}]" if row.get("status", "complete") != "complete" else ""),
              file=sys.stderr)
        rows_so_far.append(row)
        if row.get("status", "complete") != "complete":   # a crash is not "attainment too low": stop and say so
            where = f" (traceback: {write_traceback(out_dir, trace_text)})" if trace_text else ""
            what = "interrupted" if row["error"].startswith("interrupted") else f"policy {run_policy_label(cfg)} failed"
            at = f"{scale} users" if sessions is not None else f"rate_scale {scale:g}"
            raise PolicyFailed(f"capacity: {what} at {at}: {row['error']}{where}")
        return row

    out_dir.mkdir(parents=True, exist_ok=True)
    steady = None
    try:
        if sessions is not None:
            status, users, rows = search_users(logged, cap.target, sessions)
            return _users_result(cfg, cap, out_dir, status, users, rows, sessions)
        for round_ in range(max(1, cap.steady_rounds) if cap.sustain else 1):
            status, scale, rows = search(logged, cap)
            if not cap.sustain or scale is None:
                break
            searched, span = span, 2 * span
            print(f"  steady state: replaying rate_scale {scale:g} over {span:g} s of arrivals", file=sys.stderr)
            check = logged(scale)
            if check["slo_attainment"] is not None and check["slo_attainment"] >= cap.target:
                steady = searched
                break
            print(f"  rate_scale {scale:g} does not hold over {span:g} s: searching again with replays of "
                  f"{span:g} s", file=sys.stderr)
    except PolicyFailed as e:
        _write_json(out_dir, cfg, cap, {"status": "failed", "partial": True, "error": str(e),
                                        "rate_scale": None, "rate": None})
        pd.DataFrame(rows_so_far).to_csv(out_dir / "capacity.csv", index=False)
        raise
    curve = pd.DataFrame(rows).sort_values("rate_scale").reset_index(drop=True)
    rate = None if scale is None else curve.loc[curve["rate_scale"] == scale, "rate"].iloc[0]
    result = CapacityResult(status, scale, rate, cap.target, curve)
    curve.to_csv(out_dir / "capacity.csv", index=False)
    result.steady_span_s = steady
    _write_json(out_dir, cfg, cap, {"status": status, "partial": False, "error": "", "rate_scale": scale,
                                    "rate": rate, "interval": result.interval, "steady_span_s": steady,
                                    **_unreachable(result)})
    save(curve_figure(result, cfg), out_dir / "capacity.png")
    return result


def _users_result(cfg, cap: CapacityConfig, out_dir: Path, status: str, users, rows: list,
                  sessions: int) -> CapacityResult:
    """A closed-loop search's result, written as a rate search's is (capacity.json, .csv, .png)."""
    import pandas as pd
    from policylab.analysis.plots import save
    curve = pd.DataFrame(rows).sort_values("users").reset_index(drop=True)
    rate = None if users is None else float(curve.loc[curve["users"] == users, "rate"].iloc[0])
    result = CapacityResult(status, None, rate, cap.target, curve, users=users, most_users=sessions)
    curve.to_csv(out_dir / "capacity.csv", index=False)
    _write_json(out_dir, cfg, cap, {"status": status, "partial": False, "error": "", "rate_scale": None,
                                    "rate": rate, "users": users, "interval_users": result.interval,
                                    **_unreachable(result)})
    save(curve_figure(result, cfg), out_dir / "capacity.png")
    return result


def _unreachable(result: CapacityResult) -> dict:
    """For a search that missed the target at its lowest load: whether a lower load could still
    help, and the best attainment seen (capacity.json's `slo_unreachable`, `best_attainment`)."""
    if result.status != "below_range":
        return {}
    c = result.curve
    key = "users" if result.most_users is not None else "rate_scale"
    lowest = c.sort_values(key)["slo_attainment"].fillna(0.0).tolist()
    best = float(c["slo_attainment"].fillna(0.0).max())
    # one user is no load at all; on rates, a 16-fold lower load that raised nothing will not either
    flat = result.most_users is not None or len(lowest) >= 2 and lowest[0] <= lowest[1]
    return {"slo_unreachable": bool(flat), "best_attainment": best,
            "lowest_load": float(c[key].min()), "lowest_load_attainment": lowest[0]}


class PolicyFailed(RunError):
    """A replay of the search ended partial: the policy (or the data plane) failed."""


def _write_json(out_dir: Path, cfg, cap: CapacityConfig, outcome: dict) -> None:
    (out_dir / "capacity.json").write_text(json.dumps(
        {**outcome, "policy": run_policy_label(cfg), "trace": cfg.trace.name,
         "slo": {"ttft": cfg.slo.ttft, "tpot": cfg.slo.tpot}, "search": asdict(cap)}, indent=2, default=float) + "\n")


def _fmt(x, spec: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def curve_figure(result: CapacityResult, cfg):
    """Attainment (top) and p99 TTFT/TPOT (bottom) against the arrival rate, log x axis."""
    from matplotlib.figure import Figure
    c = result.curve
    fig = Figure(figsize=(9, 7), layout="constrained")
    fig.suptitle(f"capacity of {run_policy_label(cfg)} on {cfg.trace.name}: {headline(result)}")
    attain, latency = fig.subplots(2, 1, sharex=True)
    users = result.most_users is not None         # closed loop: against the users, not a rate
    x, at = (c["users"], result.users) if users else (c["rate"], result.rate)
    attain.plot(x, c["slo_attainment"] * 100, "o-", label="SLO attainment")
    attain.axhline(result.target * 100, color="black", linestyle="--", linewidth=1,
                   label=f"target {result.target:.0%}")
    attain.set(ylabel="SLO attainment (%)", ylim=(0, 105),
               title=f"SLO: TTFT ≤ {cfg.slo.ttft:g} s and TPOT ≤ {cfg.slo.tpot * 1e3:g} ms")
    latency.plot(x, c["ttft_p99"], "o-", color="tab:orange", label="p99 TTFT (s)")
    latency.axhline(cfg.slo.ttft, color="tab:orange", linestyle=":", label="TTFT SLO")
    latency.set(ylabel="p99 TTFT (s)", xlabel="concurrent users (closed loop)" if users else "arrival rate (req/s)")
    tpot = latency.twinx()
    tpot.plot(x, c["tpot_p99"] * 1e3, "s-", color="tab:purple", label="p99 TPOT (ms)")
    tpot.axhline(cfg.slo.tpot * 1e3, color="tab:purple", linestyle=":", label="TPOT SLO")
    tpot.set_ylabel("p99 TPOT (ms)")
    if at is not None:
        for ax in (attain, latency):
            ax.axvline(at, color="tab:green", linewidth=1.5, label="capacity" if ax is attain else None)
    attain.legend(fontsize="small", loc="lower left")
    lines = latency.get_legend_handles_labels()[0] + tpot.get_legend_handles_labels()[0]
    latency.legend(lines, [l.get_label() for l in lines], fontsize="small", loc="upper left")
    for ax in (attain, latency):
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
    return fig


def headline(result: CapacityResult) -> str:
    if result.most_users is not None:
        return users_headline(result.status, result.users, result.rate, result.target, result.most_users)
    if result.status == "below_range":
        if _unreachable(result)["slo_unreachable"]:
            return f"the SLO is unreachable even at the lowest load (target {result.target:.0%})"
        return f"below the search range (target {result.target:.0%} missed at the lowest rate)"
    bound = "≥ " if result.status == "above_range" else ""
    return (f"{bound}{result.rate:.3f} req/s (rate_scale {bound}{result.rate_scale:.4g}) "
            f"at SLO attainment ≥ {result.target:.0%}")


def capacity_job(cfg) -> float:
    """The Hydra job body: search, print the capacity, return it in req/s."""
    cfg = typed_config(cfg)

    def search(out_dir: Path):
        if cfg.trace.load is not None:
            raise RunError(f"trace.load={cfg.trace.load}: capacity searches over the arrival rate itself "
                           "(trace.rate_scale); leave trace.load out")
        cap = cfg.capacity
        print(f"capacity search: {run_policy_label(cfg)} on {cfg.trace.name}, target {cap.target:.0%}, "
              f"rate_scale in [{cap.lo}, {cap.hi}], {cap.iters} bisection steps", file=sys.stderr)
        return cap, find_capacity(cfg, cap, out_dir), out_dir
    cap, result, out_dir = guarded_job(search)
    print(f"capacity of {run_policy_label(cfg)} on {cfg.trace.name}: {headline(result)}")
    if result.most_users is not None:
        low, high = result.interval
        if result.status == "found":
            print(f"  between {low} users (passes) and {high} (fails)")
        _log(cfg, out_dir, result)
        if result.status != "found":
            print(advice(result.status, result.curve.to_dict("records"), cap, result.most_users), file=sys.stderr)
        print(f"results: {out_dir}")
        return float(result.rate or 0.0)
    low, high = result.interval
    if low is not None:
        print(f"  bisection interval: [{_fmt(low, '.3f')}, {_fmt(high, '.3f')}] req/s "
              f"(passes at the first, fails at the second)")
    if result.steady_span_s is not None:
        print(f"  steady state: each replay spanned >= {result.steady_span_s:g} s of arrivals, and the capacity "
              f"held over {2 * result.steady_span_s:g} s")
    elif cap.sustain and result.rate_scale is not None:
        print(f"warning: the capacity still fell when replayed over twice the span after {cap.steady_rounds} "
              "doublings: no steady state found; raise capacity.min_replay_s or capacity.steady_rounds",
              file=sys.stderr)
    _warn_short_replay(result, cap, cfg)
    _log(cfg, out_dir, result)
    if result.status == "below_range":
        print(_below_range_advice(result, cap), file=sys.stderr)
    elif result.status == "above_range":
        print(f"  raise capacity.hi (now {cap.hi}) or capacity.widen to find it", file=sys.stderr)
    print(f"results: {out_dir}")
    return float(result.rate or 0.0)


def _below_range_advice(result: CapacityResult, cap: CapacityConfig) -> str:
    """Missed at the lowest load: unreachable (a lower load no longer helped), else a lower bracket."""
    facts = _unreachable(result)
    best = f"best SLO attainment seen {facts['best_attainment']:.1%} (target {cap.target:.0%})"
    if facts["slo_unreachable"]:
        scales = sorted(result.curve["rate_scale"])
        return (f"  the SLO is unreachable even at the lowest load: at rate_scale {scales[0]:.3g} ({scales[1] / scales[0]:.3g}"
                f" times lower than the next tried, and no better) the target is missed; {best}; a lower load "
                "cannot help: relax slo.ttft / slo.tpot or capacity.target")
    return f"  {best}; lower capacity.lo (now {cap.lo}) or raise capacity.widen to find it"


def _warn_short_replay(result: CapacityResult, cap: CapacityConfig, cfg) -> None:
    """A replay of a few seconds at the found rate measures a transient, not a steady state."""
    if result.rate_scale is None or cap.sustain:
        return
    seconds = result.curve.loc[result.curve["rate_scale"] == result.rate_scale, "replay_s"].iloc[0]
    if seconds < cap.min_replay_s:
        times = math.ceil(cap.min_replay_s / seconds) * cfg.trace.repeat
        print(f"warning: at the capacity the replay lasts {seconds:.1f} s, under capacity.min_replay_s="
              f"{cap.min_replay_s:g} s: it measures a transient; lengthen the trace with trace.repeat={times} "
              "(tiles it) or use a longer trace", file=sys.stderr)


def _log(cfg, out_dir: Path, result: CapacityResult) -> None:
    """The search as a W&B run of its own (curve table, figure, capacity in the summary)."""
    from policylab.analysis.tracking import open_tracker
    from policylab.apps.settings import tracker_settings
    from policylab.apps.jobs import run_name, sweep_group
    tracker = open_tracker(tracker_settings(cfg), out_dir, sweep_group(), run_name(out_dir))
    low, high = result.interval
    tracker.log_result({"capacity": {"rate": result.rate, "rate_scale": result.rate_scale, "status": result.status,
                                      "interval_low": low, "interval_high": high, "target": result.target,
                                      **({"users": result.users} if result.most_users is not None else {})}},
                       {"capacity_curve": result.curve}, [out_dir / "capacity.png"])
    tracker.finish()


def job_args(args: list) -> list:
    """`target=0.9` → `capacity.target=0.9`; a run dir named after the job unless one is given."""
    args = expand_shorthands(args, "capacity", SHORTHANDS)
    if not any(a.startswith("hydra.run.dir=") for a in args):
        args.append(RUN_DIR)
    return args
