"""DistServe: prefill/decode disaggregation against colocated serving, in requests per second per GPU
at 90 % SLO attainment, and where it loses."""
from __future__ import annotations

from policylab.apps.reproduce.arms import capacities, curve_panel
from policylab.apps.reproduce.entry import Claim, Comparison, Entry, Outcome, Panel, Paper
from policylab.apps.reproduce.stats import Measure, Verdict, direction, magnitude, ratio
from policylab.apps.reproduce.workloads import sharegpt

TARGET = 0.9
SLOS = (("the paper's SLO", 0.25, 0.1),       # the artifact's OPT-13B ShareGPT figure (fig. 8)
        ("a relaxed SLO", 2.5, 0.15))         # where colocated serving should win: both phases fit it
BASE = ["dataplane=sim", "model=llama2-13b", "hardware=a100", "engine.max_model_len=2048", "policy=prefill_first"]
PD = ["cluster.decode_policy=chunked", "router=least_loaded", "decode_router=least_loaded"]
ARMS = {"colocated (vLLM), 1 GPU": [],
        "P/D 1 prefill + 1 decode": ["cluster.prefill_replicas=1", "cluster.decode_replicas=1", *PD],
        "P/D 2 prefill + 1 decode": ["cluster.prefill_replicas=2", "cluster.decode_replicas=1", *PD]}
GPUS = dict(zip(ARMS, (1, 2, 3)))


def per_gpu_gain(ctx, name: str, tag: str, slo: list, n: int) -> tuple:
    """(P/D's per-GPU goodput over colocated's, each arm's per-GPU Measure, the search) under `slo`
    (`name`: the files' and runs' name for it, `tag`: how it is shown)."""
    found = capacities(ctx, name, [*BASE, *slo], ARMS, lambda k: sharegpt(k, n, 1.0, max_len=2048), 1.0,
                       lambda s: s["slo_attainment"] >= TARGET, lo=0.25, hi=4.0, iters=5, partial_misses=True)
    per_gpu = {arm: [None if c is None else c / GPUS[arm] for c in found.capacity[arm]] for arm in ARMS}
    colocated, *placements = ARMS
    best = [max((v for v in vals if v is not None), default=None)           # the better placement, per replicate
            for vals in zip(*(per_gpu[p] for p in placements))]
    measures = [Measure(f"req/s per GPU at {TARGET:.0%} attainment, {tag}, {arm}", "req/s/GPU", per_gpu[arm])
                for arm in ARMS]
    return ratio(f"per-GPU goodput, P/D / colocated, {tag}", best, per_gpu[colocated]), measures, found


def measure(ctx) -> Outcome:
    n = 200 if ctx.quick else 600
    comparisons, measures, panels = [], [], []
    for (label, ttft, tpot), paper in zip(SLOS, ("up to 7.4× (over its workloads)", "the gain needs tight SLOs")):
        tag = f"TTFT ≤ {ttft:g} s, TPOT ≤ {tpot:g} s"
        gain, arms, found = per_gpu_gain(ctx, f"ttft{ttft:g}_tpot{tpot:g}", tag, [f"slo.ttft={ttft}", f"slo.tpot={tpot}"],
                                         n)
        comparisons.append(Comparison(f"per-GPU goodput, P/D / colocated, 13B chatbot, {label} ({tag})",
                                      7.4 if ttft == SLOS[0][1] else None, gain, paper))
        measures += arms
        panels.append(Panel(f"req/s per GPU at {TARGET:.0%} attainment, {tag}", "req/s per GPU",
                            bars={a.label.rsplit(", ", 1)[1]: a for a in arms}))
        if ttft == SLOS[0][1]:
            panels.append(curve_panel(f"SLO attainment against load, {tag} (replicate 1)", "SLO attainment", found,
                                      lambda s: s["slo_attainment"], TARGET, "target"))
    tight, relaxed = (c.ours for c in comparisons)
    d = direction(tight)
    verdict = Verdict(
        d, magnitude(tight.mean, 7.4, matched=False),
        ("At the paper's SLO a 2,000-token prompt's prefill alone takes most of the 0.25 s TTFT budget. Colocated, "
         "every decode step that runs ahead of a prefill (and the step an arrival waits to join) pushes long "
         "prompts past it, so attainment hovers near 90 % even at a low load; a prefill replica runs nothing but "
         "prefills. That knife edge is also why the magnitude is sensitive to step overheads: with "
         "serving_engine=none (kernel time only) the colocated GPU clears the budget more often and P/D's edge "
         "at this SLO disappears (0.94× in this replay)." if d != "does not hold" else
         "At the paper's SLO the binding constraint is TTFT, and disaggregation does not shorten a prefill; "
         "DistServe's gain comes with its parallelism search (tensor parallel prefill), not replayed here.")
        + f" Where it loses: at a relaxed SLO the colocated GPU does both phases at full use while a P/D pair's "
          f"decode GPU mostly idles: {relaxed.text()} per GPU.")
    return Outcome(comparisons, verdict, measures, panels, ctx.partial_note())


ENTRY = Entry(
    name="distserve",
    title="DistServe: prefill/decode disaggregation, per-GPU goodput",
    paper=Paper("DistServe: Disaggregating Prefill and Decoding for Goodput-optimized Large Language Model Serving "
                "(Zhong et al.)", "OSDI 2024", "https://arxiv.org/abs/2401.09670"),
    claim=Claim("Disaggregating prefill and decoding onto separate GPUs serves up to 7.4× more requests (per GPU, at "
                "90 % SLO attainment) or meets 12.6× tighter SLOs than colocated serving (vLLM, DeepSpeed-MII).", 7.4,
                "the paper's abstract"),
    paper_setting="OPT-13B, -66B and -175B on A100s; chatbot (ShareGPT), code completion (HumanEval) and "
                  "summarization (LongBench); the OPT-13B chatbot figure holds TTFT ≤ 0.25 s and TPOT ≤ 0.1 s for "
                  "90 % of requests (the artifact's plotting script, LLMServe/DistServe evaluation/); DistServe's "
                  "placement search picks each phase's parallelism and instance counts; vLLM colocated on one GPU.",
    replay_setting="A Llama-2-13B shape on simulated A100s; 600 requests per replicate with ShareGPT's lengths "
                   "(prompt + output ≤ 2,048, OPT's context) at Poisson arrivals; the paper's SLOs and 90 % "
                   "target, and a relaxed SLO (TTFT ≤ 2.5 s, TPOT ≤ 0.15 s) to show where it loses; `prefill_first` colocated on one GPU against P/D with one or two prefill replicas "
                   "(`prefill_first`) and one decode replica (`chunked`), KV over a 50 GB/s link; the better P/D "
                   "placement per replicate, capacity per GPU bisected over the load.",
    substitutions=(
        "Llama-2-13B's shape for OPT-13B: the same layers, width, heads and KV bytes per token; a gated MLP "
        "instead of OPT's GELU MLP (similar FLOPs).",
        "ShareGPT lengths from Sarathi-Serve's public length file (lognormal fit), clipped to OPT's 2,048-token "
        "context, instead of DistServe's sampled ShareGPT requests.",
        "Placement is searched over instance counts only (1 or 2 prefill replicas, 1 decode replica, one GPU "
        "each); DistServe's search also picks tensor and pipeline parallelism per phase.",
        "Step times are the simulator's A100 cost model with its default serving engine (recent vLLM's host work, "
        "CUDA graphs, async scheduling), not the paper's vLLM version; the verdict at the paper's SLO turns on "
        "those step overheads (below).",
        "The decode replica runs `chunked` (continuous batching of decodes). Above capacity a P/D replay can "
        "stall: the decode replica preempts (recomputes) running requests while handed-off ones keep taking its "
        "KV on arrival, and the recomputed request at the head of its queue then needs more blocks than are free "
        "while the waiting handed-off requests hold the rest (a limit of this engine's hand-off, not of "
        "DistServe). Such a load counts as missing the SLO and is listed in the notes; where it happens close to "
        "the capacity found, P/D's capacity is understated.",
    ),
    measure=measure,
)
