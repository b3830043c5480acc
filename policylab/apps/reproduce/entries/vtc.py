"""VTC: the Virtual Token Counter keeps the service difference of backlogged clients within its proven
2U bound; first-come first-served lets it grow without bound."""
from __future__ import annotations

from policylab.apps.reproduce.entry import Claim, Comparison, Entry, Outcome, Panel, Paper
from policylab.apps.reproduce.runner import write_workload
from policylab.apps.reproduce.stats import Measure, Verdict, ratio
from policylab.apps.reproduce.workloads import clients_at_fixed_rates

BASE = ["dataplane=sim", "model=llama2-7b", "hardware=a40", "hardware.mem_bytes=24e9"]
ARMS = {"FCFS (chunked)": ["policy=chunked"], "VTC (fairness)": ["policy=fairness"]}
RATES = {"client-a": 3.0, "client-b": 6.0}      # the artifact's overload suite's 1:2, scaled (below)
LENGTH = 256                                     # prompt and output tokens, as the artifact's
W_IN, W_OUT = 1.0, 2.0                           # VTC's service weights (fairness.w_in, w_out)


def measure(ctx) -> Outcome:
    durations = (60.0, 120.0) if ctx.quick else (180.0, 360.0)
    worst = {(arm, d): [] for arm in ARMS for d in durations}
    bound = None
    for k in range(1, ctx.replicates + 1):
        for d in durations:
            path = write_workload(ctx.path(f"workloads/vtc_{d:g}s_r{k}.jsonl"),
                                  clients_at_fixed_rates(k, RATES, d, LENGTH, LENGTH))
            trace = ["trace=file", f"trace.path={path}"]
            if bound is None:
                m = ctx.kv_tokens([*BASE, *trace, "policy=chunked"])
                bound = 2 * max(W_IN * LENGTH, W_OUT * m)       # 2U, U = max(w_in·L_input, w_out·M)
            for arm, own in ARMS.items():
                s = ctx.replay([*BASE, *trace, *own], f"{arm}, {d:g} s", k).summary
                worst[(arm, d)].append(s["fairness"]["service_difference_max"])
    fcfs, vtc = ARMS
    short, long = durations
    vtc_share = Measure("VTC: worst service difference / 2U", "", [w / bound for w in worst[(vtc, long)]])
    fcfs_share = Measure("FCFS: worst service difference / 2U", "", [w / bound for w in worst[(fcfs, long)]])
    fcfs_growth = ratio(f"FCFS: worst difference over {long:g} s / over {short:g} s", worst[(fcfs, long)],
                        worst[(fcfs, short)])
    vtc_growth = ratio(f"VTC: worst difference over {long:g} s / over {short:g} s", worst[(vtc, long)],
                       worst[(vtc, short)])
    comparisons = [Comparison("VTC: worst service difference of the two backlogged clients / 2U", 1.0, vtc_share,
                              "≤ 1 (proven)"),
                   Comparison(f"FCFS: its worst difference when the run doubles ({short:g} → {long:g} s)", None,
                              fcfs_growth, "unbounded (grows with time)")]
    bounded = (vtc_share.high if vtc_share.n > 1 else vtc_share.mean) < 1.0
    grows = (fcfs_growth.low if fcfs_growth.n > 1 else fcfs_growth.mean) > 1.2
    holds = bounded and grows and fcfs_share.mean > 1.0
    verdict = Verdict(
        "holds" if holds else "does not hold",
        f"VTC stays at {vtc_share.mean:.2f} of the bound (the paper proves ≤ 1); FCFS exceeds it "
        f"{fcfs_share.mean:.1f}× and its worst difference grows {fcfs_growth.mean:.2f}× when the run doubles "
        f"(VTC's: {vtc_growth.mean:.2f}×)",
        "FCFS serves the client that sends twice as many requests twice as much, so the gap between the clients' "
        "service grows linearly while both are backlogged; VTC admits from the client with the least counted "
        "service and keeps the gap within a bound set by one request and the KV cache.")
    measures = [vtc_share, fcfs_share, vtc_growth, fcfs_growth,
                *(Measure(f"worst service difference, {arm}, {d:g} s", "service", worst[(arm, d)])
                  for arm in ARMS for d in durations)]
    panels = [Panel("worst service difference of the backlogged clients", "service (w_in·in + w_out·out tokens)",
                    bars={f"{arm.split(' ')[0]}, {d:g} s": Measure("", "", worst[(arm, d)]) for arm in ARMS
                          for d in durations}, hlines={"2U (VTC's bound)": bound}, log_y=True)]
    return Outcome(comparisons, verdict, measures, panels,
                   [f"2U = 2·max(w_in·L_input, w_out·M) = {bound:,.0f} with L_input = {LENGTH} and M = "
                    f"{bound / (2 * W_OUT):,.0f} tokens, the simulated GPU's whole KV cache."])


ENTRY = Entry(
    name="vtc",
    title="VTC: fair service between backlogged clients, within the proven bound",
    paper=Paper("Fairness in Serving Large Language Models (Sheng et al.)", "OSDI 2024",
                "https://arxiv.org/abs/2401.00588"),
    claim=Claim("The Virtual Token Counter keeps the service difference between two backlogged clients within a "
                "tight 2× bound (2U, U = max(w_in·L_input, w_out·M)), while FCFS lets the client sending more "
                "requests take more service without bound.", None, "the paper's abstract and Theorem (2U bound)"),
    paper_setting="LLaMA-7B on one A10G (S-LoRA); the artifact's `overload` suite (Ying1123/VTC-artifact, "
                  "fair_bench/exp_suite.py): two clients sending 1.5 and 3 requests/s, evenly spaced, 256 input "
                  "and 256 output tokens each, for 6 minutes; service = w_in·input + w_out·output tokens with "
                  "w_in = 1, w_out = 2; the accumulated service difference over time, VTC against FCFS.",
    replay_setting="A LLaMA-7B shape on a simulated A40 limited to an A10G's 24 GB; the same two clients, lengths "
                   "and weights, at 3 and 6 requests/s, for 3 and 6 minutes; `fairness` (VTC) against `chunked` "
                   "(FCFS); the worst difference of the clients' service while both are backlogged.",
    substitutions=(
        "The simulated A40 (with 24 GB) stands in for the A10G; it is faster, so the artifact's rates (1.5 and "
        "3 req/s) would leave the slower client's demand below its fair share and it would not stay backlogged: "
        "the rates are doubled (the same 1:2 ratio) so that both clients stay backlogged, as in the paper's "
        "overload experiment.",
        "Continuous batching is the engine's chunked batching (decodes first, 512-token budget) for both arms; "
        "S-LoRA's adapters are not modelled (one model serves both clients).",
        "M (the bound's batch capacity in tokens) is the simulated KV cache's size.",
    ),
    measure=measure,
)
