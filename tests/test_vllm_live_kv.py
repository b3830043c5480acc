"""The KV questions a policy asks get the same answers from vLLM's KV cache manager (`LiveKV`) as
from policylab's `KVManager`, step by step.

One trace is replayed by policylab's engine and by vLLM's scheduler under the same policy (their
steps are equal: `compare_replays`); a probe policy asks, every step, each question of the view
about every request (cache hits, blocks needed, blocks freed by preempting) and the exact cost of
what-if plans that preempt running requests whose blocks waiting requests would hit. Block ids
differ between the two sides; every count must not.
"""

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM venv of .ci/run runs these tests)")

from policylab.core.config import EngineConfig  # noqa: E402
from policylab.core.contract import StepPlan  # noqa: E402
from policylab.core.policy import Policy  # noqa: E402
from policylab.core.request import TraceRequest  # noqa: E402
from policylab.integrations.vllm.policy_config import load_policy  # noqa: E402
from time_limits import time_limit  # noqa: E402


class KvProbe(Policy):
    """`chunked`, noting every step's answers to the view's KV questions before it plans."""

    def __init__(self):
        super().__init__("chunked")
        self.inner, self.answers = load_policy("chunked"), []

    def schedule(self, view):
        waiting, running = view.waiting, view.running
        asked = [view.num_free_blocks, view.decode_blocks_needed]
        for v in waiting:
            asked.append((v.req_id, v.num_cached_tokens, v.remaining_tokens, view.blocks_needed(v, 1),
                          view.blocks_needed(v, v.remaining_tokens)))
        for v in running:
            asked.append((v.req_id, view.blocks_freed_by_preempting(v),
                          view.blocks_needed(v, 1 if v.is_decode else v.remaining_tokens)))
        starts = {v.req_id: v.remaining_tokens for v in waiting}
        for k in range(len(running) + 1):          # preempt the last k running, start every waiting one
            plan = StepPlan(dict(starts), preempt=[v.req_id for v in running[len(running) - k:]])
            asked.append(view.plan_kv(plan))
        plan = self.inner.schedule(view)
        asked.append(view.plan_kv(plan))
        if plan.num_scheduled_tokens:               # (idle calls differ between the two engines)
            self.answers.append(asked)
        return plan

    def on_finished(self, req_view) -> None:
        self.inner.on_finished(req_view)


SHARED = [TraceRequest(0.0, 150 + 20 * (i % 3), 6 + i % 4, max_tokens=6 + i % 4,
                       prefix_hashes=(1, 2) if i % 2 else (1,)) for i in range(10)]
TIGHT = [TraceRequest(0.0, 300 + 37 * i, 20 + 3 * i, max_tokens=20 + 3 * i) for i in range(8)]
CASES = {
    "prefix_cache": (SHARED, EngineConfig(block_size=16, num_blocks=160, max_num_batched_tokens=64,
                                          max_num_seqs=2, max_model_len=4096, enable_prefix_caching=True)),
    "preemption": (TIGHT, EngineConfig(block_size=32, num_blocks=21, max_num_batched_tokens=256, max_num_seqs=8,
                                       max_model_len=4096, enable_prefix_caching=False)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_live_kv_answers_as_the_block_manager(case):
    from policylab.integrations.vllm.same_steps import sim_replay, vllm_replay
    trace, cfg = CASES[case]
    ours, theirs = KvProbe(), KvProbe()
    with time_limit(120):
        steps, durations, vocab = sim_replay(list(trace), ours, cfg)
        vllm_steps, run = vllm_replay(list(trace), theirs, cfg, durations, vocab)
    assert not run.unfinished
    assert [s[1:] for s in vllm_steps] == [s[1:] for s in steps]
    assert len(ours.answers) == len(steps) > 0
    if case == "prefix_cache":      # the case asks about real hits on blocks that running requests hold
        assert any(a[1] > 0 for step in ours.answers for a in step[2:] if isinstance(a, tuple) and len(a) == 5)
    else:
        assert any(p for _, _, p in steps), "the tight cache must force preemptions"
    first = next((k for k, (a, b) in enumerate(zip(ours.answers, theirs.answers)) if a != b), None)
    assert first is None and len(theirs.answers) == len(ours.answers), (
        f"step {first}: policylab {ours.answers[first] if first is not None else None}\n"
        f"vLLM {theirs.answers[first] if first is not None else None}")
