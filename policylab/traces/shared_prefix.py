"""Load-generator workloads rebuilt as traces: shared-prefix prompts sent in a cycle, in stages.

Kubernetes inference-perf's `shared_prefix` data (and vLLM's prefix-repetition benchmarks) send
`num_groups x prompts_per_group` distinct prompts: each is its group's system prompt followed by a
question of its own. inference-perf shuffles the prompts once and sends them in a fixed cycle
(request n of a stage uses prompt n mod the prompt count; every stage starts the cycle again), so
every full prompt repeats and the server's prefix cache holds whole prompts, not only the system
prompts. Its `constant` load draws rate x duration exponential gaps and rescales them to fill the
stage (a Poisson process conditioned on its count); a stage waits for its requests to finish, then
the next begins after `interval` seconds.

`shared_prefix_trace` builds such a workload as `TraceRequest`s whose `prefix_hashes` say exactly
which tokens are shared: with `prefix_block_tokens = system_prompt_tokens`, a request's first hash
is its group's system prompt and the rest are its prompt's own segments, so two requests share a
group's system prompt, and two requests of the same prompt share everything.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from policylab.core.request import TraceRequest

PROMPT_HASH_BASE = 1 << 40      # prompt segments' ids start here (group ids are below it)
SEGMENTS_PER_PROMPT = 1 << 16   # room for each prompt's own segments


@dataclass(frozen=True)
class Stage:
    """One load stage: `rate` requests/s for `duration` s (`arrivals` overrides the drawn times,
    seconds from the stage's start, e.g. the load generator's own record)."""
    rate: float
    duration: float
    arrivals: Optional[tuple] = None


@dataclass(frozen=True)
class SharedPrefixWorkload:
    num_groups: int
    prompts_per_group: int
    system_prompt_tokens: int       # tokens every prompt of a group shares (BOS included)
    prompt_tokens: Sequence[int]    # each distinct prompt's length, system prompt included
    output_tokens: Sequence[int]    # each distinct prompt's output length (ignore_eos)

    @property
    def num_prompts(self) -> int:
        return self.num_groups * self.prompts_per_group

    def check(self) -> None:
        n = self.num_prompts
        if self.num_groups < 1 or self.prompts_per_group < 1:
            raise ValueError(f"shared prefix: num_groups and prompts_per_group must be >= 1, "
                             f"got {self.num_groups} and {self.prompts_per_group}")
        if len(self.prompt_tokens) != n or len(self.output_tokens) != n:
            raise ValueError(f"shared prefix: {n} prompts need {n} prompt and output lengths, got "
                             f"{len(self.prompt_tokens)} and {len(self.output_tokens)}")
        if self.system_prompt_tokens < 1:
            raise ValueError(f"shared prefix: system_prompt_tokens must be >= 1, got {self.system_prompt_tokens}")
        if min(self.prompt_tokens) <= self.system_prompt_tokens or min(self.output_tokens) < 1:
            raise ValueError("shared prefix: every prompt must be longer than its system prompt and every "
                             "output at least one token")


def poisson_arrivals(rate: float, duration: float, seed: int) -> np.ndarray:
    """inference-perf's `constant` load: int(rate x duration) exponential gaps rescaled to sum to the
    duration (a Poisson process conditioned on its count); arrival k is the sum of the first k + 1 gaps."""
    count = int(rate * duration)
    if count < 1:
        return np.zeros(0)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, count)
    return np.cumsum(gaps * (duration / gaps.sum()))


def prompt_order(num_prompts: int, num_groups: int, seed: int) -> tuple:
    """Group of each position of the send cycle: prompts are made group by group, then shuffled once."""
    groups = np.repeat(np.arange(num_groups), num_prompts // num_groups)
    return np.random.default_rng(seed).permutation(num_prompts), groups


def shared_prefix_trace(workload: SharedPrefixWorkload, stages: Sequence[Stage], stage_gap: float,
                        seed: int = 0) -> tuple[list, list]:
    """(requests, stage of each request) for `stages` sent one after the other, stage k starting
    `stage_gap` seconds after stage k-1's last arrival (choose it longer than the slowest request,
    so that each stage starts on an idle server as the load generator's do). Each request's
    prompt follows the send cycle; `prefix_hashes` are in segments of `system_prompt_tokens`."""
    workload.check()
    if stage_gap < 0:
        raise ValueError(f"stage_gap must be >= 0 seconds, got {stage_gap}")
    n = workload.num_prompts
    order, groups = prompt_order(n, workload.num_groups, seed)
    seg = workload.system_prompt_tokens
    requests, stage_of = [], []
    start = 0.0
    for k, stage in enumerate(stages):
        times = np.asarray(stage.arrivals if stage.arrivals is not None
                           else poisson_arrivals(stage.rate, stage.duration, seed + 1 + k), dtype=float)
        for i, t in enumerate(times):
            p = int(order[i % n])
            length = int(workload.prompt_tokens[p])
            own = -(-(length - seg) // seg)
            hashes = (int(groups[p]),) + tuple(PROMPT_HASH_BASE + p * SEGMENTS_PER_PROMPT + j for j in range(own))
            requests.append(TraceRequest(arrival_time=start + float(t), prompt_tokens=length,
                                         output_tokens=int(workload.output_tokens[p]),
                                         max_tokens=int(workload.output_tokens[p]), prefix_hashes=hashes))
            stage_of.append(k)
        start += (float(times.max()) if len(times) else stage.duration) + stage_gap
    return requests, stage_of
