"""The engine's one record of its decoding requests (core/decoding.py) against the predicate."""
import pytest

from policies.chunked import Chunked
from policies.prefill_first import PrefillFirst
from policylab.core.contract import SchedulerView
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.core.engine import Engine
from policylab.core.request import TraceRequest as T, is_decoding
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.sim import SimDataPlane


@pytest.mark.timeout(60)
@pytest.mark.parametrize("policy", [PrefillFirst, Chunked])
def test_the_decoding_record_is_the_predicate_over_running_after_every_step(policy):
    """Prefills, decodes, preemptions (a small cache) and finishes: after each step the record holds
    exactly the running requests `is_decoding` says decode, those with a full last block, and the
    cached decode batch only members of it."""
    trace = [T(0.001 * i, 10 + 3 * i, 20 + 4 * (i % 5)) for i in range(12)]
    cfg = EngineConfig(block_size=4, num_blocks=24, max_num_batched_tokens=32, max_num_seqs=6)
    engine = Engine(trace, policy(), SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim")), cfg)
    preempted = steps = 0
    while engine.num_done < len(trace):
        engine.step()
        steps += 1
        record = engine._decoding
        decoding = [r.req_id for r in engine.running if is_decoding(r)]
        assert sorted(record.ids) == sorted(decoding) and len(record) == len(decoding)
        assert set(record.full) == {rid for rid in decoding if engine.requests[rid].num_computed_tokens % 4 == 0}
        assert set(record.batch_ids) <= set(record.ids)
        view = engine._view()                                # what a policy is told of them
        assert list(view.decode_tokens()) == [rid for rid in decoding] and set(view.decode_tokens().values()) <= {1}
        assert [v.req_id for v in view.prefilling] == [r.req_id for r in engine.running if not is_decoding(r)]
        hand_made = SchedulerView(*tuple(view)[:13])        # a view built outside the engine: the same answer
        assert [v.req_id for v in hand_made.prefilling] == [v.req_id for v in view.prefilling]
        preempted = max(preempted, sum(r.num_preemptions for r in engine.requests if r is not None))
    assert preempted, "the scenario must preempt, or it tests less than it says"
    assert not list(engine._decoding.ids) and steps


@pytest.mark.timeout(60)
@pytest.mark.parametrize("prefilling", [0, 1, 3, 8, 9, 25])
def test_prefilling_is_the_running_requests_outside_decoding_in_running_order(prefilling):
    """Few or many prefilling requests, anywhere in running order; a view built by hand and one
    changed with `replace` (its facts follow its running requests) answer alike."""
    trace = [T(0.0, 10, 5) for _ in range(40)]
    engine = Engine(trace, Chunked(), SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim")),
                    EngineConfig(block_size=4, num_blocks=400))
    engine.admit()
    views = list(engine.views.values())[::-1]             # running order unlike req_id order
    stride = len(views) // prefilling if prefilling else 0
    outside = {v.req_id for v in views[::stride][:prefilling]} if prefilling else set()
    decoding = frozenset(v.req_id for v in views) - outside
    view = SchedulerView(0.0, 0, (), tuple(views), decoding, 64, 64, 4, 400, 400, engine._views_ro)
    expected = [v.req_id for v in views if v.req_id in outside]
    assert [v.req_id for v in view.prefilling] == expected
    assert [v.req_id for v in view.prefilling] == expected                 # asked again
    fewer = view.replace(running=tuple(views[1:]))
    assert [v.req_id for v in fewer.prefilling] == [rid for rid in expected if rid != views[0].req_id]
    assert list(fewer.decode_tokens()) == [v.req_id for v in views[1:] if v.req_id in decoding]


class _AsksEveryDecode(Chunked):
    """chunked, checking at every step that `decode_needs_block` names exactly the decodes whose token
    `blocks_needed` says takes a block, and counting why each one does."""

    def __init__(self):
        super().__init__(chunk_size=48)
        self.full = self.copies = self.asked = 0
        self.wrong: list = []    # (step, req_id, blocks_needed, in decode_needs_block)

    def schedule(self, view):
        needs, by_id = view.decode_needs_block, view.by_id
        self.wrong += [(view.step, rid, None, True) for rid in set(needs) - set(view.decoding)]
        for rid in view.decoding:
            v = by_id[rid]
            need = view.blocks_needed(v, 1)
            if need != (rid in needs):
                self.wrong.append((view.step, rid, need, rid in needs))
            self.asked += 1
            if need:             # a new block for a full last block; else a copy of a block forks share
                self.full += v.num_computed_tokens % view.block_size == 0
                self.copies += v.num_computed_tokens % view.block_size != 0
        return super().schedule(view)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("samples", [1, 3])
def test_decode_needs_block_names_the_decodes_whose_token_takes_a_block(samples):
    """With and without copy-on-write forks (parallel samples share their prompt's blocks: the first
    token each writes into the shared last block takes a copy), on a cache small enough to preempt:
    at every step the set is `blocks_needed(v, 1)` over the decoding requests."""
    from policylab.testing.harness import _dataplane
    trace = [T(0.002 * i, 13 + 5 * i, 9 + 3 * (i % 4), n=samples) for i in range(10)]
    cfg = EngineConfig(block_size=4, num_blocks=60, max_num_batched_tokens=64, max_num_seqs=12, check_invariants=True)
    policy = _AsksEveryDecode()
    result = Engine(trace, policy, _dataplane(0), cfg).run()
    assert result.status == "complete" and not policy.wrong and policy.full > 0 and policy.asked > 100
    assert (policy.copies > 0) == (samples > 1), "forks must write into shared blocks, or it tests less than it says"
    assert any(r.num_preemptions for r in result.requests)
