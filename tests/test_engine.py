"""Engine invariants (DESIGN §2, §3, §8) over random traces and budgets, with prefill_first."""
import dataclasses
from unittest import mock

import pytest
from hypothesis import given

from policies.chunked import Chunked
from policies.prefill_first import PrefillFirst
from policylab.core.batch import CommittedStep
from policylab.core.engine import Engine
from policylab.core.config import EngineConfig
from policylab.core.request import TraceRequest as T
from policylab.testing import Scenario, check_policy, fingerprint, run_checked
from policylab.testing.strategies import scenarios

CFG = EngineConfig(block_size=16, num_blocks=20, max_num_batched_tokens=256, max_num_seqs=8)


@given(scenario=scenarios())
def test_engine_invariants_hold_over_random_traces_and_budgets(scenario):
    check_policy(PrefillFirst, scenario, properties=False)   # the policy's own promises: test_invariants


@given(scenario=scenarios())
def test_the_persistent_decode_batch_gives_the_same_replay_as_committing_request_by_request(scenario):
    """Running decodes are committed on the persistent decode batch (a cache of the one commit
    path); with it switched off every entry is committed request by request, and nothing may differ."""
    def request_by_request(engine, plan, steady=False):
        batch, requests = engine._commit_requests(plan.num_scheduled_tokens, plan.preempt, plan.reject)
        return CommittedStep(batch, 0, requests, len(plan.preempt), len(plan.reject)) if requests else None

    for policy in (PrefillFirst, Chunked):
        cached = run_checked(policy, scenario, properties=False)
        with mock.patch.object(Engine, "_commit", request_by_request):
            plain = run_checked(policy, scenario, properties=False)
        assert fingerprint(cached) == fingerprint(plain)


def test_a_request_larger_than_the_kv_cache_is_rejected_with_its_reason_and_the_rest_finish():
    trace = (T(0.0, 100, 10), T(0.0, 300, 50), T(0.01, 40, 8), T(0.02, 10, 9000))
    result = run_checked(PrefillFirst, Scenario(trace, CFG))
    status = [r.status.value for r in result.requests]
    assert status == ["finished", "rejected", "finished", "rejected"]
    assert "needs 22 KV blocks, the whole cache has 20" in result.requests[1].reject_reason
    assert "max_model_len" in result.requests[3].reject_reason
    assert result.requests[1].finish_time == 0.0 and not result.requests[1].token_times
    assert [len(r.output_ids) for r in result.requests] == [10, 0, 8, 0]


def test_same_seed_gives_identical_results_and_another_seed_does_not():
    trace = tuple(T(0.003 * i, 30 + 11 * i, 5 + i % 7, prefix_hashes=(1,) if i % 2 else ())
                  for i in range(25))
    cfg = dataclasses.replace(CFG, predictor="oracle", predictor_noise=0.5)
    runs = [fingerprint(run_checked(PrefillFirst, Scenario(trace, cfg, seed=s))) for s in (0, 0, 1)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_the_virtual_clock_jumps_over_idle_gaps_to_the_next_arrival():
    trace = (T(0.0, 20, 3), T(100.0, 20, 3))
    result = run_checked(PrefillFirst, Scenario(trace, CFG))
    late = result.requests[1]
    assert late.first_scheduled_time == 100.0 and result.requests[0].finish_time < 1.0


def test_output_blocks_are_published_when_a_request_finishes_and_a_follow_up_hits_them():
    """Output-token blocks are hashed once, at release; a later prompt extending the first
    conversation (prompt + answer) reuses every computed full block of it."""
    import numpy as np
    from policylab.core.config import HardwareConfig, ModelConfig
    from policylab.dataplane.config import DataplaneConfig
    from policylab.dataplane.sim import SimDataPlane
    from policylab.core.engine import Engine
    cfg = EngineConfig(block_size=4, num_blocks=32, max_num_batched_tokens=64, max_num_seqs=4)
    plane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"))
    first = Engine([T(0.0, 8, 8, prompt_ids=tuple(range(100, 108)))], PrefillFirst(), plane, cfg)
    first.run()
    r = first.requests[0]
    assert len(r.block_hashes) == 4                  # 16 known tokens = 4 full blocks, all hashed
    assert len(first.kv.cache_map) == 3                 # 15 computed tokens: 3 full blocks published
    follow = tuple(np.concatenate([r.prompt_ids, r.output_ids]).tolist()) + (7, 7)
    second = Engine([T(0.0, 8, 8, prompt_ids=tuple(range(100, 108))), T(50.0, 18, 2, prompt_ids=follow)],
                    PrefillFirst(), plane, cfg)
    result = second.run()
    assert result.status == "complete"
    assert result.requests[1].num_cached_tokens_total == 12    # the 3 published blocks


@pytest.mark.timeout(30)
@pytest.mark.parametrize("a_first", [[4, 4, 4], [8, 4]])
def test_a_prompt_prefilled_in_chunks_publishes_each_block_as_it_fills(a_first):
    """A's 16-token prompt goes in chunks of one block (or two, then one); B has the same prompt and waits.
    Each full block is published by the step that fills it, so B, started once A has computed 12
    tokens, takes A's 3 full blocks as hits (its last token is always computed) while A is still
    prefilling: 12 cached tokens, the same physical blocks."""
    from policylab.core.config import HardwareConfig, ModelConfig
    from policylab.core.contract import StepPlan
    from policylab.core.policy import Policy
    from policylab.dataplane.config import DataplaneConfig
    from policylab.dataplane.sim import SimDataPlane

    bs, prompt = 4, tuple(range(100, 116))

    class Scripted(Policy):
        def schedule(self, view):
            if view.step < len(a_first):
                return StepPlan({0: a_first[view.step]})
            if view.step == len(a_first):
                assert view.by_id[1].num_cached_tokens == 12 and 0 not in view.decoding
                return StepPlan({0: 4, 1: view.by_id[1].remaining_tokens})
            return StepPlan({rid: 1 for rid in view.decoding})

    cfg = EngineConfig(block_size=bs, num_blocks=16, max_num_batched_tokens=64, max_num_seqs=4)
    plane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"))
    engine = Engine([T(0.0, 16, 2, prompt_ids=prompt), T(0.0, 16, 2, prompt_ids=prompt)], Scripted("scripted"),
                    plane, cfg)
    for _ in range(len(a_first) + 1):
        engine.step()
    a, b = engine.requests
    assert b.num_cached_tokens_total == 12 and b.block_table[:3] == a.block_table[:3]
    assert engine.kv.num_used == 4 + 1                   # A's 4 blocks, B's own last one


def test_a_batch_is_never_changed_after_its_step_even_when_the_steady_batch_is_reused():
    """The persistent decode batch reuses its lists across steps; a data plane that keeps the
    batches it was sent must still see each one exactly as it ran."""
    from policylab.core.config import HardwareConfig, ModelConfig
    from policylab.dataplane.config import DataplaneConfig
    from policylab.dataplane.sim import SimDataPlane
    from policylab.core.engine import Engine

    class Keeping(SimDataPlane):
        def execute(self, batch):
            kept.append((batch, [list(f) for f in (batch.req_ids, batch.query_lens, batch.context_lens)]))
            return super().execute(batch)

    kept = []
    plane = Keeping(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"))
    trace = [T(0.0, 20 + 7 * i, 30 + 11 * i) for i in range(5)]
    result = Engine(trace, PrefillFirst(), plane, CFG).run()
    assert result.status == "complete"
    decode_steps = [b for b, _ in kept if set(b.query_lens) == {1}]
    assert len(decode_steps) > 40 and len({id(b.req_ids) for b in decode_steps}) < len(decode_steps)
    for batch, as_sent in kept:
        assert [batch.req_ids, batch.query_lens, batch.context_lens] == as_sent


def test_sim_token_ids_depend_on_seed_and_position_only_however_the_id_table_grew():
    """The sim plane's ids come from a table grown on demand; the order of growth must not
    matter (determinism), and ids stay clear of the special tokens at both ends of the vocab."""
    from policylab.core.config import HardwareConfig, ModelConfig
    from policylab.dataplane.config import DataplaneConfig
    from policylab.core.batch import Batch
    from policylab.dataplane.sim import SimDataPlane

    def ids(seed, contexts, query_lens=None):
        plane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"), seed=seed)
        out = []
        for ctx in contexts:
            q = query_lens or [1] * len(ctx)
            out += plane.execute(Batch(list(range(len(ctx))), q, ctx, sample=[True] * len(ctx))).sampled
        return out, plane.vocab_size

    far_first, vocab = ids(0, [[20_000], [5, 6]])
    near_first, _ = ids(0, [[5], [6, 20_000]])
    assert sorted(far_first) == sorted(near_first) and len(set(far_first)) == 3
    assert ids(1, [[5, 6, 20_000]])[0] != near_first
    assert ids(0, [[4, 5]], query_lens=[2, 2])[0] == far_first[1:]          # sampled after position 5, 6
    many, _ = ids(0, [list(range(3000))])
    assert 16 <= min(many) and max(many) < vocab - 16 and len(set(many)) > 2800   # ~2,860 expected of 31,968


def test_sim_plane_samples_only_where_the_batch_says_even_when_every_chunk_is_one_token():
    """A one-token prefill chunk that does not complete its prompt samples nothing: a batch of
    one-token entries is not necessarily all decodes."""
    from policylab.core.config import HardwareConfig, ModelConfig
    from policylab.dataplane.config import DataplaneConfig
    from policylab.core.batch import Batch
    from policylab.dataplane.sim import SimDataPlane

    plane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"))
    mixed = plane.execute(Batch([0, 1, 2], [1, 1, 1], [40, 3, 77], sample=[True, False, True]))
    alone = plane.execute(Batch([0, 2], [1, 1], [40, 77], sample=[True, True]))
    assert mixed.sampled == alone.sampled and len(mixed.sampled) == 2
    assert mixed.duration > alone.duration         # the unsampled chunk still costs compute and KV
