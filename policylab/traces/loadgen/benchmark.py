"""What a load generator's result says: the server, the requests, the measured stages."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class ServerKnobs:
    """vLLM's server arguments, one to one (`vllm serve --tensor-parallel-size ... --max-num-seqs ...`);
    each becomes the same policylab key (dataplane.tensor_parallel, engine.max_num_seqs, ...)."""
    tensor_parallel: int = 1                # --tensor-parallel-size
    max_num_seqs: int = 256                 # --max-num-seqs
    max_num_batched_tokens: int = 2048      # --max-num-batched-tokens
    block_size: int = 16                    # --block-size
    gpu_memory_utilization: float = 0.9     # --gpu-memory-utilization: KV blocks for the model, TP and GPU
    enable_prefix_caching: bool = True      # --enable-prefix-caching / --no-enable-prefix-caching
    max_model_len: Optional[int] = None     # --max-model-len (None: the model's context length)


@dataclass
class MeasuredStage:
    """One load stage as the client measured it (seconds; means over the successful requests)."""
    stage: int
    rate: float                      # requested rate (req/s); inf: all at once
    requests_ok: int
    requests_failed: int
    ttft_mean: float
    e2e_mean: float
    per_token_interval: float        # (E2E mean - TTFT mean) / (mean output tokens - 1)
    output_tokens_mean: float = 0.0
    duration: float = 0.0
    schedule_delay: float = 0.0      # mean seconds a request went out after its scheduled time (where said)
    ttft_median: float = math.nan    # (where the result says: a TTFT tail is sized from these and the mean)
    ttft_p99: float = math.nan


@dataclass
class Benchmark:
    name: str
    model: str                       # a configs/model/ preset (`hf` with model_config: a config.json)
    gpu: str                         # a configs/hardware/ preset
    server: ServerKnobs
    requests: list                   # TraceRequest, in arrival order
    stage_of: list                   # the stage of each request
    stages: list                     # MeasuredStage, one per stage
    prefix_block_tokens: int = 512   # tokens each prefix hash covers
    model_config: Optional[str] = None
    notes: list = field(default_factory=list)   # what was assumed (said in the printout)
    # seconds after which the load generator's clients give up on a request, where its result or its
    # defaults say (None: unknown); a run with failed requests is replayed with it
    client_timeout: Optional[float] = None
    # per stage, the load generator's cap on requests in flight where it recorded no send times (its
    # --max-concurrency, or concurrency level): a request goes out at its arrival time or when another
    # finishes, whichever is later (all arriving at once: closed-loop users); None for a stage without
    # one; None: no stage had one
    concurrency: Optional[tuple] = None
