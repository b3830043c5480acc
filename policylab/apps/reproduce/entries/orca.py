"""Orca (and vLLM's continuous batching after it): iteration-level scheduling against request-level
batching (FasterTransformer): throughput at the same latency."""
from __future__ import annotations

from policylab.apps.reproduce.arms import capacities, curve_panel, stat
from policylab.apps.reproduce.entry import Claim, Comparison, Entry, Outcome, Panel, Paper
from policylab.apps.reproduce.runner import write_workload
from policylab.apps.reproduce.stats import Measure, Verdict, direction, magnitude
from policylab.apps.reproduce.workloads import uniform_lengths
from policylab.core.request import TraceRequest

BASE = ["dataplane=sim", "model=gpt3-175b", "hardware=a100", "dataplane.tensor_parallel=8",
        "engine.max_num_seqs=32", "engine.max_num_batched_tokens=16384"]
ARMS = {"request-level (FasterTransformer: decode_first)": ["policy=decode_first"],
        "iteration-level (Orca: decode_first into free slots)": ["policy=decode_first",
                                                                  "policy.admit_into_free_slots=true"]}
LATENCY_FACTOR = 2.0      # the latency both arms are held to: this × a lone request's normalized latency


def measure(ctx) -> Outcome:
    n = 150 if ctx.quick else 1000
    lone_path = write_workload(ctx.path("workloads/lone.jsonl"), [TraceRequest(0.0, 272, 65)])
    lone = ctx.replay([*BASE, "policy=decode_first", "trace=file", f"trace.path={lone_path}"], "a lone request", 0)
    bound = LATENCY_FACTOR * stat(lone.summary, "normalized_latency", "p50")
    found = capacities(ctx, "orca", BASE, ARMS, lambda k: uniform_lengths(k, n, 1.0, (32, 512), (1, 128)), 1.0,
                       lambda s: stat(s, "normalized_latency", "p50") <= bound, lo=0.25, hi=16.0)
    request, iteration = ARMS
    gain = found.gain(iteration, request, "throughput at the same latency, iteration- / request-level")
    peak = {arm: Measure(f"peak throughput, {arm}", "req/s",
                         [max(stat(s, "throughput", "requests_per_s") for _, s, _ in found.curves[arm])])
            for arm in ARMS}
    comparisons = [Comparison("throughput at the same latency, GPT-3 175B", 36.9, gain, "36.9×")]
    measures = [found.measure(request, "capacity, request-level"), found.measure(iteration, "capacity, iteration-level"),
                *peak.values()]
    panels = [Panel(f"throughput at median normalized latency ≤ {bound * 1e3:.0f} ms/token", "req/s",
                    bars={"request-level": measures[0], "iteration-level": measures[1]}),
              curve_panel("median normalized latency against load (replicate 1)", "median E2E / output tokens (s)",
                          found, lambda s: stat(s, "normalized_latency", "p50"), bound, "latency held", log_y=True)]
    verdict = Verdict(direction(gain), magnitude(gain.mean, 36.9, matched=False),
                      "Request-level batching makes a new request wait for the whole running batch to drain, so "
                      "its latency passes the bound at a low load; iteration-level admission fills each freed "
                      "slot at the next step. The paper's 36.9× is at its own latency level and FasterTransformer's "
                      "batch sizes on its testbed, which this replay does not reproduce (below).")
    return Outcome(comparisons, verdict, measures, panels,
                   [f"Latency held: median normalized latency (E2E / output tokens) ≤ {bound * 1e3:.1f} ms/token, "
                    f"{LATENCY_FACTOR:g}× that of a lone 272-token prompt with 65 output tokens on the same "
                    f"simulated GPUs."])


ENTRY = Entry(
    name="orca",
    title="Orca: iteration-level scheduling against request-level batching",
    paper=Paper("Orca: A Distributed Serving System for Transformer-Based Generative Models (Yu et al.)", "OSDI 2022",
                "https://www.usenix.org/conference/osdi22/presentation/yu"),
    claim=Claim("Iteration-level scheduling (with selective batching) gives 36.9× the throughput of NVIDIA "
                "FasterTransformer's request-level batching at the same level of latency, on GPT-3 175B.", 36.9,
                "the paper's abstract"),
    paper_setting="GPT-3 175B on A100 GPUs with intra- and inter-layer parallelism; a synthesized trace: Poisson "
                  "arrivals, input lengths uniform in [32, 512], outputs uniform in [1, 128]; median normalized "
                  "latency (ms per generated token) against throughput, Orca and FasterTransformer at several "
                  "maximum batch sizes.",
    replay_setting="A GPT-3 175B shape on 8 simulated A100s (TP8); 1,000 requests per replicate from the paper's "
                   "length distributions; both arms the same engine and policy family with at most 32 running "
                   "requests: decode_first (a new batch only when the running one has drained: request-level) "
                   "against decode_first admitting into free slots at every step (iteration-level); the highest "
                   "load whose median normalized latency stays within 2× a lone request's.",
    substitutions=(
        "GPT-3's GELU MLP is modelled as a gated MLP with the same parameters and FLOPs; the paper's exact GPU "
        "count and parallel layout are not reproduced (TP8 on 80 GB A100s here).",
        "Both arms run on a paged KV cache; FasterTransformer reserved KV for each request's maximum length, "
        "which limits its batch further: the replay's request-level baseline is stronger than the paper's.",
        "One maximum batch size (32) for both arms instead of the paper's sweep; the latency both are held to "
        "(2× a lone request's normalized latency) is this replay's choice; the paper's 36.9× is read at its own "
        "latency level, so the magnitude is not a test of it.",
        "Selective batching (prefill and decode in one batch) is the engine's ordinary mixed step.",
    ),
    measure=measure,
)
