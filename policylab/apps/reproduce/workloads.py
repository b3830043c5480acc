"""The generated workloads of the reproductions, each drawn to the published description of a paper's
workload, seeded by the replicate (replicate k draws its own requests from the same distributions).

Lengths of public datasets come as lognormals fitted to the median and 90th percentile of the
published length files (clamped to their maximum), since the files themselves are not
redistributed here; where a paper gives a uniform range it is used as given. Every generator
returns `TraceRequest`s with arrivals starting at 0 s; `runner.write_workload` writes them as a
native trace.
"""
from __future__ import annotations

import math

import numpy as np

from policylab.core.request import TraceRequest
from policylab.core.extensions.tool_calls import ToolCall

Z90 = 1.2815515655446004        # the standard normal's 90th percentile


def lognormal(rng: np.random.Generator, n: int, median: float, p90: float, low: int, high: int) -> np.ndarray:
    """Whole lengths from the lognormal with this median and 90th percentile, clamped to [low, high]."""
    sigma = math.log(p90 / median) / Z90
    return np.clip(np.rint(rng.lognormal(math.log(median), sigma, n)), low, high).astype(np.int64)


def poisson_times(rng: np.random.Generator, n: int, rate: float) -> np.ndarray:
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    return t - t[0]


# ShareGPT as Sarathi-Serve's artifact publishes it (microsoft/sarathi-serve @ 72339db,
# data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv, 30,731 requests):
# prompts median 1,730 / p90 5,696 / max 8,141 tokens, outputs median 415 / p90 834 / max 1,024.
SHAREGPT = {"prompt": (1730, 5696, 8141), "output": (415, 834, 1024)}


def sharegpt(seed: int, n: int, rate: float, max_len: int = 8192) -> list:
    """Poisson arrivals at `rate` req/s with ShareGPT's lengths; prompt + output <= max_len."""
    rng = np.random.default_rng([seed, 1])
    (pm, p9, pmax), (om, o9, omax) = SHAREGPT["prompt"], SHAREGPT["output"]
    outputs = lognormal(rng, n, om, o9, 2, min(omax, max_len // 2))
    prompts = np.minimum(lognormal(rng, n, pm, p9, 8, pmax), max_len - outputs)
    times = poisson_times(rng, n, rate)
    return [TraceRequest(round(float(t), 6), int(p), int(o)) for t, p, o in zip(times, prompts, outputs)]


def uniform_lengths(seed: int, n: int, rate: float, prompt: tuple, output: tuple) -> list:
    """Poisson arrivals; prompt and output lengths uniform over the inclusive ranges (Orca's)."""
    rng = np.random.default_rng([seed, 2])
    times = poisson_times(rng, n, rate)
    prompts = rng.integers(prompt[0], prompt[1] + 1, n)
    outputs = rng.integers(output[0], output[1] + 1, n)
    return [TraceRequest(round(float(t), 6), int(p), int(o)) for t, p, o in zip(times, prompts, outputs)]


def clients_at_fixed_rates(seed: int, rates: dict, duration: float, prompt: int, output: int) -> list:
    """VTC's `overload` suite: each client sends evenly spaced requests at its own rate (req/s) for
    `duration` seconds, all of one prompt and output length (the artifact's 256 / 256); the
    clients' phases are drawn from the seed."""
    rng = np.random.default_rng([seed, 3])
    rows = []
    for client, rate in rates.items():
        phase = rng.random() / rate
        for k in range(int(duration * rate)):
            rows.append((phase + k / rate, client))
    rows.sort()
    start = rows[0][0]
    return [TraceRequest(round(t - start, 6), prompt, output, client) for t, client in rows]


def shared_prefix_groups(seed: int, groups: int, per_group: int, prefix_blocks: int, block_tokens: int,
                         question: tuple, output: tuple, rate: float | None) -> list:
    """Few-shot programs (SGLang's MMLU/HellaSwag style): `groups` shared prefixes of
    `prefix_blocks` blocks of `block_tokens` tokens (trace.prefix_block_tokens), `per_group`
    questions per prefix, in random order; all at once (`rate` None: an offline batch, as
    SGLang's throughput runs) or Poisson at `rate`. The question is the request's own tail."""
    rng = np.random.default_rng([seed, 4])
    n = groups * per_group
    order = rng.permutation(np.repeat(np.arange(groups), per_group))
    questions = rng.integers(question[0], question[1] + 1, n)
    outputs = rng.integers(output[0], output[1] + 1, n)
    times = np.zeros(n) if rate is None else poisson_times(rng, n, rate)
    prefix = prefix_blocks * block_tokens
    return [TraceRequest(round(float(t), 6), prefix + int(q), int(o),
                         prefix_hashes=tuple(range(g * prefix_blocks, (g + 1) * prefix_blocks)))
            for t, g, q, o in zip(times, order, questions, outputs)]


def agent_programs(seed: int, n: int, rate: float, prompt: tuple, call_output: tuple, tool_s: float,
                   result_tokens: int, calls: tuple) -> list:
    """Agentic programs (Autellix's single-threaded programs): each a request whose output is
    interrupted by tool calls. The number of LLM calls per program is heavy-tailed (a lognormal of
    `calls` = (median, p90, max): most programs are short, a few very long), each call's output
    uniform in `call_output`, each tool exponential with mean `tool_s` returning `result_tokens`
    tokens; prompts uniform in `prompt`; Poisson arrivals at `rate` programs/s."""
    rng = np.random.default_rng([seed, 5])
    times = poisson_times(rng, n, rate)
    prompts = rng.integers(prompt[0], prompt[1] + 1, n)
    counts = lognormal(rng, n, calls[0], calls[1], 1, calls[2])
    out = []
    for t, p, k in zip(times, prompts, counts):
        segments = rng.integers(call_output[0], call_output[1] + 1, int(k))
        ends = np.cumsum(segments)
        tools = tuple(ToolCall(int(e), float(rng.exponential(tool_s)), result_tokens) for e in ends[:-1])
        out.append(TraceRequest(round(float(t), 6), int(p), int(ends[-1]), tool_calls=tools))
    return out


def gamma_times(rng: np.random.Generator, n: int, rate: float, cv: float) -> np.ndarray:
    """Gamma-distributed gaps at mean `rate` req/s and coefficient of variation `cv` (bursts: cv > 1)."""
    shape = 1.0 / (cv * cv)
    t = np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), n))
    return t - t[0]


def heavy_tailed_long_outputs(seed: int, n: int, rate: float, cv: float = 2.0, high: float = 0.0) -> list:
    """Llumnix's generated workloads as its paper describes them: Gamma arrivals (bursty at cv > 1),
    heavy-tailed prompt and output lengths (lognormals: prompts median 256 / p90 1,024 tokens,
    outputs median 384 / p90 1,536, both clamped to 4,096 in all), so that some requests decode for
    thousands of tokens and the replicas holding them fill up; a fraction `high` of them high
    priority (priority 0, the others 1)."""
    rng = np.random.default_rng([seed, 6])
    times = gamma_times(rng, n, rate, cv)
    outputs = lognormal(rng, n, 384, 1536, 8, 3072)
    prompts = np.minimum(lognormal(rng, n, 256, 1024, 8, 4000), 4096 - outputs)
    priority = (rng.random(n) >= high).astype(int)
    return [TraceRequest(round(float(t), 6), int(p), int(o), priority=int(c))
            for t, p, o, c in zip(times, prompts, outputs, priority)]
