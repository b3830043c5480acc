"""vLLM's scheduler without a model: build it from policylab's engine settings, feed it a trace,
fabricate the model runner's outputs, and record what it scheduled step by step.

The scheduler is the whole decision of a vLLM step; the model runner only turns a
`SchedulerOutput` into sampled tokens. Driving `schedule()` / `update_from_output()` with
made-up tokens (one per request that completes its known tokens, as the runner samples them)
reproduces every scheduling decision of the engine, in a fraction of the time: this is how
the conformance tests and the scheduler benchmark run vLLM.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Optional

from policylab.core.config import EngineConfig
from policylab.core.request import TraceRequest
from policylab.core.synthetic_prompts import synthesize_prompt


@dataclass
class BareStep:
    """One executed step as vLLM scheduled it, in policylab's integer request ids."""
    clock: float
    num_scheduled_tokens: dict       # req id -> tokens, in batch order
    preempted: tuple                 # req ids preempted by this step
    finished: tuple                  # req ids that finished after it


@dataclass
class BareRun:
    steps: list = field(default_factory=list)
    scheduler: object = None
    unfinished: int = 0


@lru_cache(maxsize=1)
def _base_config(model_dir: str):
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    model = ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=8192, dtype="float32")
    scheduler = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=8192, max_model_len=8192,
                                is_encoder_decoder=False, enable_chunked_prefill=True, async_scheduling=False)
    cache = CacheConfig(block_size=32, enable_prefix_caching=False)
    cache.num_gpu_blocks = 2
    return VllmConfig(model_config=model, scheduler_config=scheduler, cache_config=cache,
                      device_config=DeviceConfig("cpu"))


def bare_scheduler(scheduler_cls, cfg: EngineConfig, num_blocks: int, model_dir: Optional[str] = None,
                   **scheduler_options):
    """A vLLM scheduler of `scheduler_cls` with policylab's budgets: `num_blocks` usable KV blocks (vLLM
    gets one more, its null block), `cfg.block_size`, `cfg.max_num_batched_tokens`, `cfg.max_num_seqs`,
    `cfg.enable_prefix_caching`; `scheduler_options` set other SchedulerConfig fields."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from policylab.integrations.vllm.tiny_model import tiny_model_dir
    vc = copy.deepcopy(_base_config(model_dir or str(tiny_model_dir())))
    sc = vc.scheduler_config
    sc.max_num_seqs, sc.max_num_batched_tokens = cfg.max_num_seqs, cfg.max_num_batched_tokens
    sc.max_num_scheduled_tokens = None
    for key, value in scheduler_options.items():
        setattr(sc, key, value)
    vc.model_config.max_model_len = cfg.max_model_len
    vc.cache_config.block_size = cfg.block_size
    vc.cache_config.enable_prefix_caching = cfg.enable_prefix_caching
    vc.cache_config.num_gpu_blocks = num_blocks + 1
    spec = FullAttentionSpec(block_size=cfg.block_size, num_kv_heads=1, head_size=16, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=num_blocks + 1, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    return scheduler_cls(vc, kv, StructuredOutputManager(vc), block_size=cfg.block_size, log_stats=False)


def vllm_requests(trace: list, cfg: EngineConfig, vocab_size: int, seed: int = 0, prefix_block_tokens: int = 512):
    """The trace as vLLM `Request`s with the prompt ids policylab's engine gives the same requests
    (same shared prefixes, so the same prefix-cache hits), in arrival order."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    from policylab.integrations.vllm.scheduler import META_KEY
    hasher = None
    if cfg.enable_prefix_caching:
        fn = get_hash_fn_by_name("sha256")
        init_none_hash(fn)
        hasher = get_request_block_hasher(cfg.block_size, fn)
    order = sorted(range(len(trace)), key=lambda i: trace[i].arrival_time)
    out = []
    for i in order:
        t: TraceRequest = trace[i]
        ids = t.prompt_ids if t.prompt_ids is not None else synthesize_prompt(
            i, t.prompt_tokens, t.prefix_hashes, vocab_size, seed, prefix_block_tokens)
        meta = {"client": t.client, "ttft_slo": t.ttft_slo, "tpot_slo": t.tpot_slo}
        params = SamplingParams(max_tokens=t.max_tokens or t.output_tokens, ignore_eos=True,
                                extra_args={META_KEY: meta})
        out.append((t.arrival_time, Request(str(i), [int(x) for x in ids], params, None,
                                            arrival_time=t.arrival_time, priority=t.priority,
                                            block_hasher=hasher)))
    return out


def fake_output(scheduler_output, scheduler, token: int = 7):
    """The model runner's output for a step: one token for each request whose scheduled tokens reach
    the end of its known tokens (a prefill's last chunk, or a decode), none for a partial chunk."""
    from vllm.v1.outputs import ModelRunnerOutput
    ids = list(scheduler_output.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        r = scheduler.requests[rid]
        sampled.append([token] if r.num_computed_tokens >= r.num_tokens else [])
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
                             sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={}, pooler_output=[])


def run_bare(scheduler, requests: list, duration: Callable[[int, object], float], clock=None,
             max_steps: int = 100_000) -> BareRun:
    """Replay `requests` ((arrival, vLLM Request), in arrival order) through `scheduler` on a virtual
    clock: arrivals join when the clock passes them, each executed step lasts `duration(step, output)`
    seconds, an empty step waits for the next arrival (one that only preempts is followed at once by
    the next schedule, at the same time). `clock` is a one-element list the scheduler's
    clock reads (PolicyScheduler.with_policy(..., clock=lambda: box[0])), set here."""
    box = clock if clock is not None else [0.0]
    run = BareRun(scheduler=scheduler)
    nxt, step, idle = 0, 0, 0
    known: dict = {}
    while nxt < len(requests) or scheduler.has_unfinished_requests():
        while nxt < len(requests) and requests[nxt][0] <= box[0]:
            r = requests[nxt][1]
            scheduler.add_request(r)
            known[r.request_id] = int(r.request_id)
            nxt += 1
        output = scheduler.schedule()
        if not output.num_scheduled_tokens:
            scheduler.update_from_output(output, fake_output(output, scheduler))
            if output.preempted_req_ids and idle < max_steps:   # a step that only preempts: schedule
                idle += 1                                       # again at once, as vLLM's engine loop does
                continue
            if nxt >= len(requests):
                if scheduler.has_unfinished_requests():
                    run.unfinished = scheduler.get_num_unfinished_requests()
                break
            box[0] = max(box[0], requests[nxt][0])
            continue
        start = box[0]
        box[0] = start + duration(step, output)
        live = set(output.num_scheduled_tokens)
        scheduler.update_from_output(output, fake_output(output, scheduler))
        finished = tuple(known[rid] for rid in live if rid not in scheduler.requests)
        run.steps.append(BareStep(start, {known[rid]: n for rid, n in output.num_scheduled_tokens.items()},
                                  tuple(known[rid] for rid in (output.preempted_req_ids or ())), finished))
        step += 1
        if step >= max_steps:
            run.unfinished = scheduler.get_num_unfinished_requests()
            break
    return run
