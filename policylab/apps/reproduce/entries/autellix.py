"""Autellix: program-level least attained service (`plas`) against first-come first-served calls on
agentic programs: program throughput at the same latency."""
from __future__ import annotations

from policylab.apps.reproduce.arms import capacities, curve_panel
from policylab.apps.reproduce.baselines import CallFcfs
from policylab.apps.reproduce.entry import Claim, Comparison, Entry, Outcome, Panel, Paper
from policylab.apps.reproduce.runner import write_workload
from policylab.apps.reproduce.stats import Measure, Verdict, direction, magnitude
from policylab.apps.reproduce.workloads import agent_programs

BASE = ["dataplane=sim", "model=llama3-8b", "hardware=a100", "engine.max_num_seqs=16"]
ARMS = {"per-call FCFS (vLLM)": [CallFcfs], "PLAS (Autellix)": ["policy=plas"]}
LOW_LOAD, LATENCY_FACTOR = 0.25, 2.0


def programs(k: int, n: int) -> list:
    return agent_programs(k, n, 1.0, (256, 1024), (32, 256), 1.0, 64, (1, 16, 64))


def jct(s: dict) -> float:
    return float(s["programs"]["jct"]["mean"])


def measure(ctx) -> Outcome:
    n = 200 if ctx.quick else 500
    bounds = []
    for k in range(1, ctx.replicates + 1):       # the latency both arms are held to: 2× their unloaded mean JCT
        path = write_workload(ctx.path(f"workloads/programs_r{k}.jsonl"), programs(k, n))
        low = ctx.replay([*BASE, "trace=file", f"trace.path={path}", f"trace.rate_scale={LOW_LOAD}"],
                         "per-call FCFS at low load", k, policy_class=CallFcfs)
        bounds.append(LATENCY_FACTOR * jct(low.summary))
    bound = sum(bounds) / len(bounds)
    found = capacities(ctx, "programs", BASE, ARMS, lambda k: programs(k, n), 1.0, lambda s: jct(s) <= bound,
                       lo=0.5, hi=4.0, iters=5)
    fcfs, plas = ARMS
    gain = found.gain(plas, fcfs, "program throughput at the same mean latency, PLAS / per-call FCFS")
    comparisons = [Comparison("program throughput at the same latency, PLAS / vLLM's per-call FCFS", 4.0, gain,
                              "4-15× (whole system)")]
    verdict = Verdict(direction(gain), magnitude(gain.mean, 4.0, matched=False),
                      "Least attained service admits short programs and programs early in their life ahead of "
                      "long-running ones, so most programs stop queueing behind the few long ones; per-call FCFS "
                      "sends every resumed call to the back of the queue. Autellix's 4-15× is its whole system "
                      "against vLLM (with its load balancer across engines and its own engine overheads); the "
                      "replay isolates the order on one engine.")
    measures = [found.measure(fcfs, "capacity, per-call FCFS"), found.measure(plas, "capacity, PLAS"),
                Measure("mean JCT both are held to", "s", [bound])]
    panels = [Panel(f"programs/s at mean job completion time ≤ {bound:.1f} s", "programs/s",
                    bars={arm: m for arm, m in zip(ARMS, measures)}),
              curve_panel("mean JCT against load (replicate 1)", "mean JCT (s)", found, jct, bound, "latency held",
                          log_y=True)]
    return Outcome(comparisons, verdict, measures, panels,
                   [f"Latency held: mean job completion time (tools' time included) ≤ {bound:.1f} s, {LATENCY_FACTOR:g}× "
                    f"that of per-call FCFS at {LOW_LOAD:g} programs/s (mean over the replicates)."])


ENTRY = Entry(
    name="autellix",
    title="Autellix: program-level least attained service on agentic programs",
    paper=Paper("Autellix: An Efficient Serving Engine for LLM Agents as General Programs (Luo et al.)", "arXiv 2025",
                "https://arxiv.org/abs/2502.13965"),
    claim=Claim("Scheduling LLM calls by their program's attained service (PLAS for single-threaded programs, ATLAS "
                "for multi-threaded ones) improves program throughput 4-15× over vLLM at the same latency.", 4.0,
                "the paper's abstract"),
    paper_setting="Llama-3.1 models on A100/H100 GPUs behind Autellix's process table and load balancer; agentic "
                  "workloads (chatbot sessions, ReAct/BFCL tool use, LATS search) whose programs make many LLM "
                  "calls with heavy-tailed counts and lengths; vLLM's per-call FCFS as the baseline; average "
                  "program latency against arrival rate.",
    replay_setting="A Llama-3-8B shape on one simulated A100 with at most 16 running requests; 500 programs per "
                   "replicate at Poisson arrivals: each a request whose output is cut into LLM calls by tool calls "
                   "(calls per program lognormal with median 1, p90 16, at most 64; 32-256 tokens per call; tools "
                   "exponential with mean 1 s, returning 64 tokens; prompts 256-1,024 tokens); `plas` against a "
                   "per-call FCFS baseline (a resumed call joins the back of the queue, as in vLLM); the highest "
                   "load whose mean JCT stays within 2× per-call FCFS's at 0.25 programs/s.",
    substitutions=(
        "A generated program mix drawn to the paper's description (heavy-tailed calls per program) instead of its "
        "agent traces.",
        "One engine; Autellix's load balancer across engines and ATLAS (multi-threaded programs) are not replayed.",
        "At most 16 running requests, standing in for the KV-bound batch of the paper's long-context programs: "
        "without a queue at the engine, the order of waiting calls changes nothing.",
        "The baseline is vLLM's order (per-call FCFS) on this engine, not vLLM itself; the engine's own FCFS "
        "(`chunked`, which puts a resumed call in front) is a different, program-aware baseline.",
    ),
    measure=measure,
)
