"""PolicyScheduler in vLLM's full engine (`vllm.LLM`, CPU, a tiny random Llama saved as an HF
directory): the plans the policy made while vLLM served the model are step for step the plans
of policylab's own replay of the same requests, preemptions included."""
import os

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run runs these tests)")

from policylab.core.config import EngineConfig  # noqa: E402
from policylab.core.request import TraceRequest  # noqa: E402
from policylab.core.synthetic_prompts import synthesize_prompt  # noqa: E402
from time_limits import time_limit  # noqa: E402

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


TRACE = [TraceRequest(0.0, 100 + 30 * i, 10 + 4 * i, max_tokens=10 + 4 * i) for i in range(12)]
TIGHT = EngineConfig(block_size=32, num_blocks=21, max_num_batched_tokens=256, max_num_seqs=8, max_model_len=640,
                     enable_prefix_caching=False)


def serve(policy_spec, cfg: EngineConfig, trace):
    """Serve the trace (all at once) with vLLM under the policy; (plans the policy made, outputs)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from policylab.integrations.vllm.policy_config import load_policy
    from policylab.integrations.vllm.same_steps import Recording
    from policylab.integrations.vllm.scheduler import PolicyScheduler
    from policylab.integrations.vllm.tiny_model import tiny_model_dir
    from policylab.testing.vllm_models import vllm_engine
    recording = Recording(load_policy(policy_spec))
    prompts = [TokensPrompt(prompt_token_ids=[int(x) for x in synthesize_prompt(i, t.prompt_tokens, t.prefix_hashes,
                                                                                8192, 0, 512)])
               for i, t in enumerate(trace)]
    params = [SamplingParams(max_tokens=t.output_tokens, ignore_eos=True, temperature=0.0) for t in trace]
    with vllm_engine(model=str(tiny_model_dir()), scheduler_cls=PolicyScheduler.with_policy(recording),
                     skip_tokenizer_init=True, block_size=cfg.block_size, enforce_eager=True, async_scheduling=False,
                     max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
                     max_model_len=cfg.max_model_len, enable_prefix_caching=cfg.enable_prefix_caching,
                     num_gpu_blocks_override=cfg.num_blocks + 1, gpu_memory_utilization=0.1, dtype="float32",
                     seed=0) as llm:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    return [(s, p) for _, s, p, _ in recording.plans if s], outputs


@pytest.mark.parametrize("policy", ["chunked", "prefill_first"])
def test_full_engine_applies_the_policy_step_for_step(policy):
    from policylab.integrations.vllm.same_steps import sim_replay
    with time_limit(300):
        served, outputs = serve(policy, TIGHT, TRACE)
        ours, _, _ = sim_replay(TRACE, policy, TIGHT)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [t.output_tokens for t in TRACE]
    assert all(0 <= tok < 8192 for o in outputs for tok in o.outputs[0].token_ids)
    assert sum(len(p) for _, p in served) > 0, "the tight cache must force preemptions"
    first = next((k for k, (a, b) in enumerate(zip(served, [(s, p) for _, s, p in ours])) if a != b), None)
    assert first is None and len(served) == len(ours), \
        f"{policy}: step {first} of {len(ours)} (policylab) / {len(served)} (vLLM) differs"
