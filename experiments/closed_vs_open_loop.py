"""How much an open-loop replay of a chat trace overstates queueing (docs/sessions.md).

A conversation trace is recorded on one system: generated sessions (Poisson starts, geometric
turns, exponential think times) run in closed loop on the sim plane (Llama-3-8B shape, H100),
and each turn's arrival time and real prompt (the conversation so far) are logged, as a
serving system logs its requests. That log is then replayed on a slower system (--target
GPU) two ways:
  open loop   — every request at its logged time, with its logged prompt ids (the prefix
                cache sees the same reuse), whatever the target's speed;
  closed loop — the same sessions, each turn sent its think time after the target answered
                the previous one.
On the slower target an open-loop replay sends a turn before the previous answer has come back
(a user who has not read it yet) and keeps the recorded pace however long the queue grows; a
closed-loop client slows down with the server. Printed per configuration, as mean ± 95% CI over
--replicates seeds: queueing delay (mean, p99), TTFT p99, session time p50 and the share of
turns sent before their previous turn finished.

Usage: python experiments/closed_vs_open_loop.py [--sessions 80] [--replicates 5]
                                                 [--rate 1.5] [--target a40] [--reference h100]
(sessions of at most 10 turns; a conversation past the model's 8192 tokens is rejected, and counted)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policylab.apps.cluster_build import hardware_config          # noqa: E402
from policylab.core.config import EngineConfig                    # noqa: E402
from policylab.core.engine import Engine                          # noqa: E402
from policylab.core.request import Status, TraceRequest                   # noqa: E402
from policylab.dataplane.config import DataplaneConfig            # noqa: E402
from policylab.dataplane.sim import SimDataPlane                  # noqa: E402
from policylab.testing.loader import load_policy                  # noqa: E402
from policylab.testing.replay import model_config                 # noqa: E402
from policylab.traces.arrivals import ArrivalProcess              # noqa: E402
from policylab.traces.lengths import LengthDist                   # noqa: E402
from policylab.traces.session_generate import SessionSpec, generate_sessions  # noqa: E402
from policylab.traces.sessions import plan_of                     # noqa: E402

MODEL = "llama3-8b"
CFG = EngineConfig(max_model_len=8192, max_num_batched_tokens=2048, max_num_seqs=64)


def engine(trace: list, gpu: str, seed: int, sessions=None) -> Engine:
    plane = SimDataPlane(model_config(MODEL), hardware_config(gpu), DataplaneConfig(kind="sim"), seed=seed)
    return Engine(trace, load_policy("chunked"), plane, CFG, seed=seed, sessions=sessions)


def closed(plan, gpu: str, seed: int):
    result = engine(list(plan.trace), gpu, seed, sessions=plan).run()
    assert not result.partial, result.error
    return result.requests


def open_loop(recorded: list, plan, gpu: str, seed: int):
    """The recorded log replayed at its times: the requests the reference served (a turn it
    rejected stays rejected here, so both replays have the same turns)."""
    served = [i for i, r in enumerate(recorded) if r.status is Status.FINISHED]
    trace = [TraceRequest(recorded[i].arrival_time, len(recorded[i].prompt_ids), plan.trace[i].output_tokens,
                          plan.session[i], prompt_ids=tuple(int(x) for x in recorded[i].prompt_ids)) for i in served]
    order = np.argsort([t.arrival_time for t in trace], kind="stable")
    result = engine([trace[k] for k in order], gpu, seed).run()
    assert not result.partial, result.error
    back = list(recorded)
    for pos, k in enumerate(order):
        back[served[k]] = result.requests[pos]
    return back


def figures(reqs: list, plan) -> dict:
    done = [r for r in reqs if r.status is Status.FINISHED]
    queue = np.array([r.first_scheduled_time - r.arrival_time for r in done])
    ttft = np.array([r.token_times[0] - r.arrival_time for r in done])
    early = [plan.turn[i] > 0 and r.arrival_time < reqs[i - 1].finish_time for i, r in enumerate(reqs)]
    spans: dict = {}
    for i, r in enumerate(reqs):
        first, last = spans.get(plan.session[i], (r.arrival_time, r.finish_time))
        spans[plan.session[i]] = (min(first, r.arrival_time), max(last, r.finish_time))
    later = sum(1 for k in plan.turn if k > 0)
    return {"queueing mean (s)": queue.mean(), "queueing p99 (s)": np.percentile(queue, 99),
            "TTFT p99 (s)": np.percentile(ttft, 99),
            "session time p50 (s)": np.median([b - a for a, b in spans.values()]),
            "turns sent early (%)": 100.0 * sum(early) / max(later, 1), "rejected": len(reqs) - len(done)}


def mean_ci(values: list) -> str:
    v = np.asarray(values, dtype=float)
    half = 1.96 * v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan")
    return f"{v.mean():8.3f} ± {half:.3f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=80)
    p.add_argument("--replicates", type=int, default=5)
    p.add_argument("--rate", type=float, default=1.5, help="session starts per second")
    p.add_argument("--reference", default="h100", help="GPU the trace is recorded on")
    p.add_argument("--target", default="a40", help="GPU it is replayed on")
    a = p.parse_args(argv)
    spec = SessionSpec(ArrivalProcess("poisson", rate=a.rate), mean_turns=4.0, max_turns=10, think_time=3.0,
                       first_prompt=LengthDist("lognormal", mean=800, at=1600),
                       follow_up=LengthDist("lognormal", mean=120, at=250),
                       output_len=LengthDist("lognormal", mean=200, at=400))
    rows: dict = {"recorded (closed loop on the reference)": [], "open-loop replay on the target": [],
                  "closed-loop replay on the target": []}
    for seed in range(a.replicates):
        plan = plan_of(generate_sessions(spec, a.sessions, seed=seed))
        recorded = closed(plan, a.reference, seed)
        rows["recorded (closed loop on the reference)"].append(figures(recorded, plan))
        rows["open-loop replay on the target"].append(figures(open_loop(recorded, plan, a.target, seed), plan))
        rows["closed-loop replay on the target"].append(figures(closed(plan, a.target, seed), plan))
    print(f"{a.sessions} sessions at {a.rate} starts/s (mean 4 turns, 3 s think), {MODEL}, recorded on "
          f"{a.reference}, replayed on {a.target}; mean ± 95% CI over {a.replicates} seeds")
    names = list(next(iter(rows.values()))[0])
    print("| replay | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    for label, runs in rows.items():
        print(f"| {label} | " + " | ".join(mean_ci([r[n] for r in runs]).strip() for n in names) + " |")
    opened, closed_ = rows["open-loop replay on the target"], rows["closed-loop replay on the target"]
    for n in ("queueing mean (s)", "queueing p99 (s)", "TTFT p99 (s)"):
        ratio = [o[n] / c[n] for o, c in zip(opened, closed_) if c[n] > 0]
        print(f"open / closed {n:24s} {mean_ci(ratio)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
