"""Hypothesis strategies for the invariant harness: small traces, budgets and KV caches.

Sizes are chosen so that every code path shows up in a few examples: bursts (many equal
arrival times), prompts longer than the token budget, KV caches a few requests wide (so
preemption happens), prefixes shared between requests (prefix-cache hits), requests that
never fit (rejected), several clients, priorities and SLOs.
"""
from __future__ import annotations

from hypothesis import strategies as st

from policylab.core.config import EngineConfig
from policylab.core.request import TraceRequest
from policylab.testing.harness import Scenario

CLIENTS = ("alice", "bob", "carol")
GAPS = st.sampled_from([0.0, 0.0, 0.0, 0.0, 0.001, 0.01, 0.05, 0.3]) | st.floats(0.0, 0.1)


@st.composite
def trace_requests(draw, max_prompt: int = 200, max_output: int = 24) -> tuple:
    """(gap since the previous arrival, TraceRequest fields except the arrival time)."""
    return (draw(GAPS), dict(
        prompt_tokens=draw(st.integers(1, max_prompt)),
        output_tokens=draw(st.integers(1, max_output)),
        client=draw(st.sampled_from(CLIENTS)),
        priority=draw(st.integers(0, 2)),
        ttft_slo=draw(st.none() | st.sampled_from([0.02, 0.2, 2.0])),
        tpot_slo=draw(st.none() | st.sampled_from([0.005, 0.05, 0.5])),
        prefix_hashes=draw(st.sampled_from([(), (), (1,), (1, 2), (3,)])),
        max_tokens=draw(st.none() | st.integers(1, max_output))))


@st.composite
def traces(draw, max_requests: int = 30, max_prompt: int = 200, max_output: int = 24) -> tuple:
    """A trace of 1..max_requests requests in arrival order."""
    items = draw(st.lists(trace_requests(max_prompt, max_output), min_size=1, max_size=max_requests))
    out, t = [], 0.0
    for gap, fields in items:
        t += gap
        out.append(TraceRequest(arrival_time=round(t, 6), **fields))
    return tuple(out)


@st.composite
def engine_configs(draw, largest_request: int = 256) -> EngineConfig:
    """Small caches (mostly 1-4x the largest request, so a few requests fill them and
    preemption happens; sometimes smaller, so some requests never fit), small or tiny
    budgets, varied block sizes. max_num_seqs <= max_num_batched_tokens, as vLLM requires.
    """
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    scale = draw(st.sampled_from([1.0, 1.5, 2.0, 4.0, 0.5]))
    capacity = max(16, int(largest_request * scale) + block_size)
    budget = draw(st.sampled_from([1, 8, 64, 256, 2048]) | st.integers(1, 600))
    return EngineConfig(
        block_size=block_size,
        num_blocks=max(1, capacity // block_size),
        max_num_batched_tokens=budget,
        max_num_seqs=draw(st.integers(1, min(16, budget))),
        max_model_len=draw(st.sampled_from([8192, 8192, 8192, 160])),
        enable_prefix_caching=draw(st.booleans()),
        max_tokens=draw(st.none() | st.integers(1, 32)),
        predictor=draw(st.sampled_from(["none", "oracle"])),
        predictor_noise=draw(st.sampled_from([0.0, 0.5])))


@st.composite
def scenarios(draw, max_requests: int = 30, max_prompt: int = 200, max_output: int = 24) -> Scenario:
    trace = draw(traces(max_requests, max_prompt, max_output))
    return Scenario(trace=trace,
                    engine=draw(engine_configs(max(t.prompt_tokens + t.output_tokens for t in trace))),
                    seed=draw(st.integers(0, 3)),
                    prefix_block_tokens=draw(st.sampled_from([16, 32, 512])))


@st.composite
def lever_scenarios(draw, max_requests: int = 30, max_prompt: int = 200, max_output: int = 24,
                    host_blocks: tuple = (0, 4, 64)) -> Scenario:
    """`scenarios` with the KV hierarchy's levers drawn too: a host tier for swap preemption (none,
    small, ample: `host_blocks`), the prefix index (chained-hash map or radix tree) and the prefix
    cache's host and disk tiers (none, small, ample; a disk under a host tier or not)."""
    import dataclasses
    scenario = draw(scenarios(max_requests, max_prompt, max_output))
    prefix_host = draw(st.sampled_from([0, 4, 64])) if scenario.engine.enable_prefix_caching else 0
    engine = dataclasses.replace(scenario.engine, host_kv_blocks=draw(st.sampled_from(host_blocks)),
                                 prefix_cache=draw(st.sampled_from(["hash", "radix"])),
                                 swap_overlap=draw(st.booleans()), prefix_host_blocks=prefix_host,
                                 prefix_disk_blocks=draw(st.sampled_from([0, 8])) if prefix_host else 0)
    return dataclasses.replace(scenario, engine=engine)


@st.composite
def fork_scenarios(draw, max_requests: int = 20, max_prompt: int = 200, max_output: int = 24) -> Scenario:
    """`lever_scenarios` with parallel samples or beams: per request (`n` with its forks' lengths,
    or `beam_width`), or for every request through the engine's overrides."""
    import dataclasses
    scenario = draw(lever_scenarios(max_requests, max_prompt, max_output))
    trace = []
    for t in scenario.trace:
        kind = draw(st.sampled_from(["one", "samples", "beam"]))
        if kind == "samples":
            n = draw(st.integers(2, 4))
            lengths = draw(st.sampled_from([(), tuple(draw(st.integers(1, max_output)) for _ in range(n - 1))]))
            t = dataclasses.replace(t, n=n, fork_output_tokens=lengths)
        elif kind == "beam":
            t = dataclasses.replace(t, beam_width=draw(st.integers(2, 4)))
        trace.append(t)
    engine = dataclasses.replace(scenario.engine, parallel_samples=draw(st.sampled_from([0, 0, 0, 1, 3])),
                                 beam_width=draw(st.sampled_from([0, 0, 0, 2])))
    return dataclasses.replace(scenario, trace=tuple(trace), engine=engine)
