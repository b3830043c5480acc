"""What `PolicyScheduler` can carry out, checked once when vLLM builds it: one line per refusal."""
from __future__ import annotations


class UnsupportedVllmConfig(ValueError):
    """A vLLM feature the policy scheduler cannot honour; the message says what to change."""


def check_supported(vllm_config, kv_cache_config) -> None:
    sc = vllm_config.scheduler_config
    refuse = _refusal(vllm_config, kv_cache_config, sc)
    if refuse:
        raise UnsupportedVllmConfig(f"policylab PolicyScheduler: {refuse}")


def _refusal(vllm_config, kv_cache_config, sc) -> str | None:
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    if sc.async_scheduling:
        return ("async scheduling would show the policy a view one step stale; start vLLM with "
                "async_scheduling=False (vllm serve --no-async-scheduling)")
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        return (f"the model has {len(groups)} KV cache groups (hybrid attention); policylab's view holds one "
                "block table per request: only models with one full-attention KV group are supported")
    spec = groups[0].kv_cache_spec
    if type(spec) is not FullAttentionSpec or spec.sliding_window is not None or spec.attention_chunk_size:
        return (f"KV cache spec {type(spec).__name__} (sliding window or chunked local attention) is not "
                "supported: only full attention")
    if vllm_config.speculative_config is not None:
        return "speculative decoding is not supported (a plan gives each decode exactly one token)"
    if vllm_config.kv_transfer_config is not None:
        return ("KV connectors (P/D disaggregation, offloading) are not supported: they move KV outside the "
                "step plan")
    if vllm_config.parallel_config.pipeline_parallel_size > 1:
        return "pipeline parallelism is not supported (several batches in flight)"
    if vllm_config.lora_config is not None:
        return "LoRA is not supported (max_loras is a constraint the plan does not know)"
    if vllm_config.model_config.runner_type == "pooling":
        return "pooling models are not supported (the policies plan generation)"
    return None
