"""Llumnix: live migration of running requests across replicas. Waits for the migration lever
(`policylab.apps.reproduce.levers`): its planned setting is written down here, and its
`measure` is to be written against that lever's router decision once the engine has it."""
from __future__ import annotations

from policylab.apps.reproduce.entry import Claim, Entry, Paper

# The arms the replay will compare once migration exists: the same replicas and dispatch, with
# and without the rebalancer moving running requests (load balancing and de-fragmentation).
PLANNED_ARMS = {
    "dispatch only (INFaaS++-like: least loaded, no migration)": ["router=least_loaded"],
    "Llumnix (least loaded + live migration rebalancer)": ["router=least_loaded", "+cluster.migration=llumnix"],
}

ENTRY = Entry(
    name="llumnix",
    title="Llumnix: live migration across replicas cuts tail latency",
    paper=Paper("Llumnix: Dynamic Scheduling for Large Language Model Serving (Sun et al.)", "OSDI 2024",
                "https://arxiv.org/abs/2406.03243"),
    claim=Claim("Rescheduling running requests across instances by live migration improves tail latencies by an "
                "order of magnitude, accelerates high-priority requests by up to 1.5× and saves up to 36 % of the "
                "cost at similar tail latency, against dispatch-only scheduling.", 10.0, "the paper's abstract"),
    paper_setting="A 16-GPU cluster of model instances (LLaMA-7B one GPU each, LLaMA-30B on four), generated "
                  "traces with heavy-tailed lengths and Poisson/Gamma arrivals; Llumnix's virtual-usage rebalancer "
                  "migrating running requests (KV copied block by block while they decode, then a short "
                  "stop-and-copy) against INFaaS++ dispatch; P99 prefill and decode latency, fragmentation.",
    replay_setting="Not replayed yet.",
    substitutions=(
        "The simulator's A100 cost model for the paper's GPUs and kernels; the link model (50 GB/s + 20 µs, or "
        "Vidur's measured send/recv profile) prices the migration copies.",
        "A generated power-law-length trace drawn to the paper's description instead of its exact traces.",
    ),
    requires=("migration",),
    planned="8 replicas of Llama-2-7B (one A100 each), 4,000 requests with power-law lengths (prompts and outputs "
            "up to 8k) at Gamma arrivals (CV 2) near the cluster's capacity, 3 replicates; arms: least-loaded "
            "dispatch without migration against the same dispatch with a Llumnix-style rebalancer (virtual usage, "
            "migration priced on the link and checked by the contract); compare P99 TTFT and P99 TPOT (paper: ~10× "
            "tail), the high-priority class's mean latency with 10 % high-priority requests (paper: 1.5×) and the "
            "KV fragmentation at the moments a request waits (blocks free in total but not on one replica).",
)
