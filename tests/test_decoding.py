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
