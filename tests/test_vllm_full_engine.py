"""The bare vLLM Scheduler that the conformance harness drives schedules as the whole vLLM engine does.

`vllm.LLM` runs a tiny random-weight Llama (saved with transformers' save_pretrained), token-id
prompts, ignore_eos, 21 usable KV blocks of 32 tokens (so requests are preempted), and every step
its own scheduler makes is recorded; the harness's bare scheduler, given the same requests, must
make the same steps. Skips where vLLM is not importable, fails then under POLICYLAB_REQUIRE_VLLM=1.
"""
from __future__ import annotations

import os

import pytest

try:
    import vllm  # noqa: F401
    _MISSING = ""
except Exception as e:
    _MISSING = f"vllm is not importable here ({type(e).__name__}: {e}); the vLLM tests run in .venv-vllm"

if _MISSING and os.environ.get("POLICYLAB_REQUIRE_VLLM") == "1":
    raise RuntimeError(f"POLICYLAB_REQUIRE_VLLM=1 but {_MISSING}")
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=_MISSING or "vllm present")

from test_vllm_conformance import _burst, time_limit  # noqa: E402  (same directory, pytest's rootdir)


def engine_steps(scenario) -> tuple:
    """(steps, output lengths) of vllm.LLM on the scenario's requests (all arriving at once)."""
    from policylab.testing.vllm_models import tiny_llama_dir, vllm_engine
    s = scenario
    with vllm_engine(model=tiny_llama_dir(), skip_tokenizer_init=True, block_size=s.block_size,
                     gpu_memory_utilization=0.1, num_gpu_blocks_override=s.num_blocks + 1,
                     max_model_len=s.max_model_len, max_num_batched_tokens=s.max_num_batched_tokens,
                     max_num_seqs=s.max_num_seqs, enable_prefix_caching=s.enable_prefix_caching, enforce_eager=True,
                     dtype="float32", seed=0) as llm:
        return _recorded_steps(llm, s)


def _recorded_steps(llm, s) -> tuple:
    """Run the scenario's requests through `llm`, recording every step its own scheduler makes."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    sched = llm.llm_engine.engine_core.engine_core.scheduler
    index = {tuple(r.prompt_ids): i for i, r in enumerate(s.ordered())}
    steps, schedule = [], sched.schedule

    def recording_schedule(*args, **kwargs):
        out = schedule(*args, **kwargs)
        def idx(rid):
            return index[tuple(sched.requests[rid].prompt_token_ids)]
        preempted = frozenset(idx(rid) for rid in out.preempted_req_ids or ())
        if out.num_scheduled_tokens or preempted:
            steps.append(({idx(rid): n for rid, n in out.num_scheduled_tokens.items()}, preempted))
        return out

    sched.schedule = recording_schedule
    outputs = llm.generate([TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in s.ordered()],
                           [SamplingParams(max_tokens=r.output_tokens, ignore_eos=True) for r in s.ordered()],
                           use_tqdm=False)
    return steps, [len(o.outputs[0].token_ids) for o in outputs]


def test_bare_scheduler_equals_the_vllm_engine():
    from policylab.testing.vllm_conformance import run_policylab, run_vllm
    scenario = _burst(21, max_model_len=512)
    with time_limit(540):
        steps, lengths = engine_steps(scenario)
        output_ids = run_policylab(scenario)[1]
        bare = [(r.tokens, frozenset(r.preempted)) for r in run_vllm(scenario, output_ids)]
    assert lengths == [r.output_tokens for r in scenario.ordered()]
    assert sum(len(p) for _, p in steps) > 0                        # the case exercises preemption
    first = next((k for k, (a, b) in enumerate(zip(steps, bare)) if a != b), None)
    assert first is None and len(steps) == len(bare), (
        f"{len(steps)} engine steps, {len(bare)} bare; first difference at step {first}: "
        f"engine {steps[first] if first is not None else None}, bare {bare[first] if first is not None else None}")
