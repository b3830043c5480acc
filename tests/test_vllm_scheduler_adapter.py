"""PolicyScheduler inside vLLM's real v1 scheduler (bare: fabricated model outputs).

Every shipped policy must schedule inside vLLM exactly as in policylab's own replay, step for
step (tokens per request in batch order, preemptions), on generated scenarios: bursts and
gaps, prompts longer than the budget, KV caches a few requests wide (preemption), shared
prefixes with prefix caching on, priorities, clients, SLOs, requests that can never fit.
"""
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run runs these tests)")

from hypothesis import given, strategies as st  # noqa: E402

from policylab.core.config import EngineConfig  # noqa: E402
from policylab.core.contract import ContractViolation, StepPlan  # noqa: E402
from policylab.core.policy import Policy  # noqa: E402
from policylab.core.request import TraceRequest  # noqa: E402
from policylab.integrations.vllm.same_steps import compare_replays  # noqa: E402
from time_limits import time_limit  # noqa: E402

SPECULATING = {"spec_adaptive"}   # plans draft tokens, which vLLM here refuses (test_vllm_speculative.py)
POLICIES = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "configs" / "policy").glob("*.yaml")
                  if p.stem not in SPECULATING)


@st.composite
def scenarios(draw):
    block_size = draw(st.sampled_from([16, 32]))
    budget = draw(st.sampled_from([64, 256, 512]) | st.integers(16, 600))
    n = draw(st.integers(1, 14))
    t, trace = 0.0, []
    for _ in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.0, 0.002, 0.02, 0.2]))
        out = draw(st.integers(1, 24))
        trace.append(TraceRequest(
            arrival_time=round(t, 6), prompt_tokens=draw(st.integers(1, 400)), output_tokens=out, max_tokens=out,
            client=draw(st.sampled_from(["alice", "bob"])), priority=draw(st.integers(0, 2)),
            ttft_slo=draw(st.none() | st.sampled_from([0.02, 2.0])),
            tpot_slo=draw(st.none() | st.sampled_from([0.005, 0.5])),
            prefix_hashes=draw(st.sampled_from([(), (), (1,), (1, 2)]))))
    caching = draw(st.booleans())
    if caching:      # a cache that never evicts (see docs/vllm-engine.md: duplicate prefix blocks)
        blocks = sum(-(-(r.prompt_tokens + r.output_tokens) // block_size) for r in trace) + 1
    else:            # mostly a few requests wide (preemption), sometimes too small for some (rejected)
        largest = max(r.prompt_tokens + r.output_tokens for r in trace)
        blocks = max(2, int(largest * draw(st.sampled_from([0.8, 1.2, 2.0, 4.0, 20.0]))) // block_size)
    cfg = EngineConfig(block_size=block_size, num_blocks=blocks, max_num_batched_tokens=budget,
                       max_num_seqs=draw(st.integers(1, min(12, budget))), max_model_len=8192,
                       enable_prefix_caching=caching)
    return trace, cfg


@pytest.mark.parametrize("policy", POLICIES)
@given(scenario=scenarios())
def test_policy_schedules_inside_vllm_as_in_its_own_replay(policy, scenario):
    trace, cfg = scenario
    with time_limit(120):
        divergence = compare_replays(list(trace), policy, cfg)
    assert divergence is None, f"{policy} with {cfg}:\n{divergence}"


def test_several_partial_prefills_and_preemption_step_for_step():
    """12 prompts at once into a KV cache of 21 blocks: preemptions, and 3 prefills in flight."""
    trace = [TraceRequest(0.0, 300 + 37 * i, 20 + 3 * i, max_tokens=20 + 3 * i) for i in range(12)]
    cfg = EngineConfig(block_size=32, num_blocks=21, max_num_batched_tokens=256, max_num_seqs=8,
                       max_model_len=4096, enable_prefix_caching=False)
    with time_limit(120):
        for policy in ("chunked max_partial_prefills=3", "chunked", "prefill_first"):
            assert compare_replays(trace, policy, cfg) is None, policy


def test_prefix_cache_hits_step_for_step():
    """Requests sharing a 4-block prefix: the later ones start from vLLM's cached blocks."""
    trace = [TraceRequest(0.01 * i, 200, 8, max_tokens=8, prefix_hashes=(1,)) for i in range(6)]
    cfg = EngineConfig(block_size=32, num_blocks=64, max_num_batched_tokens=128, max_num_seqs=4,
                       max_model_len=4096, enable_prefix_caching=True)
    with time_limit(120):
        assert compare_replays(trace, "chunked", cfg) is None


class _Greedy(Policy):
    """Schedules every waiting prompt whole, whatever the budget: breaks token_budget."""

    def schedule(self, view):
        return StepPlan({v.req_id: v.remaining_tokens for v in view.waiting})


def test_a_plan_that_breaks_the_contract_ends_the_stream_with_contract_violation():
    from policylab.integrations.vllm.bare import bare_scheduler, run_bare, vllm_requests
    from policylab.integrations.vllm.scheduler import PolicyScheduler
    cfg = EngineConfig(block_size=32, num_blocks=64, max_num_batched_tokens=128, max_num_seqs=4,
                       enable_prefix_caching=False)
    scheduler = bare_scheduler(PolicyScheduler.with_policy(_Greedy("greedy")), cfg, 64)
    with time_limit(60), pytest.raises(ContractViolation) as e:
        run_bare(scheduler, vllm_requests([TraceRequest(0.0, 300, 4)], cfg, 8192), lambda k, _: 0.01)
    assert e.value.rule == "token_budget" and e.value.policy == "greedy"
    assert not scheduler.running                    # nothing of the plan was applied


def test_rejections_reach_the_client_with_the_reason():
    from policylab.integrations.vllm.bare import bare_scheduler, vllm_requests
    from policylab.integrations.vllm.scheduler import PolicyScheduler

    class RejectAll(Policy):
        def schedule(self, view):
            return StepPlan(reject={v.req_id: "over quota" for v in view.waiting})

    cfg = EngineConfig(block_size=32, num_blocks=64, max_num_batched_tokens=128, max_num_seqs=4,
                       enable_prefix_caching=False)
    scheduler = bare_scheduler(PolicyScheduler.with_policy(RejectAll("reject_all")), cfg, 64)
    with time_limit(60):
        for _, r in vllm_requests([TraceRequest(0.0, 40, 4), TraceRequest(0.0, 4000, 4)], cfg, 8192):
            scheduler.add_request(r)           # the second can never fit: refused on arrival
        out = scheduler.schedule()
        outputs = scheduler.update_from_output(out, _empty_output())
    reasons = {o.request_id: o.stop_reason for o in outputs[0].outputs}
    assert reasons["0"] == "rejected by policy: over quota"
    assert reasons["1"].startswith("needs 126 KV blocks")
    assert all(o.finish_reason is not None for o in outputs[0].outputs)
    assert not scheduler.has_unfinished_requests()


def _empty_output():
    from vllm.v1.outputs import ModelRunnerOutput
    return ModelRunnerOutput(req_ids=[], req_id_to_index={})


def test_async_scheduling_and_hybrid_kv_are_refused_with_one_line():
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

    from policylab.integrations.vllm.bare import bare_scheduler
    from policylab.integrations.vllm.scheduler import PolicyScheduler
    from policylab.integrations.vllm.support import UnsupportedVllmConfig, check_supported
    cfg = EngineConfig(block_size=32, num_blocks=16, max_num_batched_tokens=128, max_num_seqs=4)
    with pytest.raises(UnsupportedVllmConfig, match="async scheduling .* --no-async-scheduling"):
        bare_scheduler(PolicyScheduler.with_policy("chunked"), cfg, 16, async_scheduling=True)
    ok = bare_scheduler(PolicyScheduler.with_policy("chunked"), cfg, 16)
    full = FullAttentionSpec(block_size=32, num_kv_heads=1, head_size=16, dtype=torch.float32)
    window = SlidingWindowSpec(block_size=32, num_kv_heads=1, head_size=16, dtype=torch.float32, sliding_window=64)
    hybrid = KVCacheConfig(num_blocks=17, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["a"], full), KVCacheGroupSpec(["b"], window)])
    with pytest.raises(UnsupportedVllmConfig, match="2 KV cache groups"):
        check_supported(ok.vllm_config, hybrid)
    sliding = KVCacheConfig(num_blocks=17, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["b"], window)])
    with pytest.raises(UnsupportedVllmConfig, match="only full attention"):
        check_supported(ok.vllm_config, sliding)


def test_tiny_model_has_configs_tiny_shape():
    import yaml

    from policylab.integrations.vllm.tiny_model import tiny_shape
    shipped = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "model" / "tiny.yaml").read_text())
    shape = tiny_shape()
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "max_position_embeddings"):
        assert getattr(shape, key) == shipped[key], key
