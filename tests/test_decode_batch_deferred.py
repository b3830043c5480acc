"""The decode batch's deferred tokens (core/decode_batch.py): on a plane with positional tokens a
step writes no member's token or time; whoever reads them, mid-run or after a member left, must
get exactly what a batch that writes them every step gives."""
import pytest

from policies.chunked import Chunked
from policylab.core.capabilities import Capability
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.core.engine import Engine
from policylab.core.request import TraceRequest as T
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.sim import SimDataPlane


def _engine(deferred: bool, cfg: EngineConfig, trace: list) -> Engine:
    plane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"), seed=3)
    if not deferred:                        # a plane that does not declare its ids positional
        plane.capabilities = plane.capabilities - {Capability.POSITIONAL_TOKENS}
    return Engine(trace, Chunked(chunk_size=40), plane, cfg, seed=3)


def _seen(engine: Engine, rid: int) -> tuple:
    """What a reader sees of one request: its count and token count (read before anything settles
    it), its view's facts if live, and its lists."""
    r = engine.requests[rid]
    view = engine.views.get(rid)
    counts = r.num_computed_tokens, r.num_tokens, view.remaining_tokens if view is not None else None
    facts = (view.num_output_tokens, view.num_tokens, view.last_token_time, view.first_token_time,
             view.is_decode) if view is not None else None
    return counts, facts, list(r.output_ids), list(r.token_times), r.num_computed_tokens


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_blocks", [400, 40])
def test_deferred_tokens_read_mid_run_and_after_leaving_are_the_eager_ones(num_blocks):
    """Two engines in lockstep, one deferring its decode tokens and one writing them every step;
    a few requests are read at some steps only (so reads find several steps pending), and every
    request at the end (finished members left the batch steps before). A small cache preempts,
    which clears the batch."""
    trace = [T(0.003 * i, 9 + 7 * (i % 5), 15 + 11 * (i % 4)) for i in range(24)]
    cfg = EngineConfig(block_size=4, num_blocks=num_blocks, max_num_batched_tokens=48, max_num_seqs=10)
    lazy, eager = _engine(True, cfg, trace), _engine(False, cfg, trace)
    assert lazy._decoding._batch._tokens is not None and eager._decoding._batch._tokens is None
    pending = reads = step = 0
    while lazy.num_done < len(trace):
        lazy.step()
        eager.step()
        step += 1
        assert lazy.clock.now == eager.clock.now and lazy.num_done == eager.num_done
        batch = lazy._decoding._batch
        members = set(batch.req_ids)
        for r in lazy.requests:
            if r is not None and r.req_id not in members:
                assert r.deferred is None, f"request {r.req_id} left the batch with tokens deferred"
        if step % 5:
            continue
        for rid in range(step % 3, len(trace), 3):          # a third of them, each every 15 steps
            r = lazy.requests[rid]
            if r is None:
                continue
            if r.deferred is not None and batch._steps - r.deferred.since > 1:
                pending += 1
            reads += 1
            assert _seen(lazy, rid) == _seen(eager, rid), f"request {rid} read at step {step}"
    for rid in range(len(trace)):
        assert _seen(lazy, rid) == _seen(eager, rid), f"finished request {rid}"
        assert len(lazy.requests[rid].output_ids) == trace[rid].output_tokens
    assert pending > 20 and reads > pending, "reads must find several steps pending, or it tests less than it says"
    assert (num_blocks == 40) == any(r.num_preemptions for r in lazy.requests)


@pytest.mark.timeout(60)
def test_a_plane_without_positional_ids_or_with_eos_writes_every_step():
    """The deferral is the plane's to allow, and only where no EOS can end a decode early."""
    trace = [T(0.0, 8, 12)]
    for model, stop_at_eos, capabilities, deferred in [(ModelConfig(), False, None, True),
                                                       (ModelConfig(eos_token_id=20), True, None, False),
                                                       (ModelConfig(eos_token_id=20), False, None, True),
                                                       (ModelConfig(), False, {Capability.KV_BYTES}, False)]:
        plane = SimDataPlane(model, HardwareConfig(), DataplaneConfig(kind="sim"))
        if capabilities is not None:
            plane.capabilities = frozenset(capabilities)
        engine = Engine(trace, Chunked(), plane, EngineConfig(block_size=4, num_blocks=64, stop_at_eos=stop_at_eos))
        assert (engine._decoding._batch._tokens is not None) == deferred, (model.eos_token_id, stop_at_eos)
        engine.run()
        assert len(engine.requests[0].output_ids) == len(engine.requests[0].token_times) == 12 or stop_at_eos


@pytest.mark.timeout(60)
def test_a_request_taken_by_another_batch_keeps_its_new_deferral_when_the_old_batch_clears():
    """A migrating request joins the destination's batch while the source's still lists it: the
    source settling it later must not switch off the destination's deferral."""
    import numpy as np
    from policylab.core.decode_batch import DecodeBatch
    from policylab.core.request import Request
    tokens = lambda start, stop: [1000 + p for p in range(start, stop)]   # noqa: E731 - id after p
    r = Request(0, 0.0, np.zeros(6, np.int32), 50, output_ids=[7], num_computed_tokens=6, token_times=[0.5])
    source, destination = DecodeBatch([r], [20], 4, tokens), DecodeBatch([r], [20], 4, tokens)
    source.become([0])
    for t in (1.0, 2.0):
        source.batch()
        source.advance([], t, None)
    assert r.num_computed_tokens == 8 and r.output_ids == [7, 1006, 1007] and r.token_times == [0.5, 1.0, 2.0]
    destination.become([0])
    destination.advance([], 3.0, None)
    source.clear()
    assert r.deferred is not None, "the source's clear switched off the destination's deferral"
    destination.advance([], 4.0, None)
    assert r.num_computed_tokens == 10 and r.num_tokens == 6 + 5
    assert r.output_ids == [7, 1006, 1007, 1008, 1009] and r.token_times == [0.5, 1.0, 2.0, 3.0, 4.0]
    destination.leave([r])
    assert r.deferred is None and r.output_ids == [7, 1006, 1007, 1008, 1009]


def test_successor_contexts_are_each_plus_one_and_the_table_grows_to_cover_them():
    """A deferring batch's next context lengths come from a shared table of successors: each is
    its context + 1 (none, one or many members; contexts past the table's end grow it), in a
    fresh list."""
    from policylab.core import decode_batch

    for context in ([], [7], [0, 5], [3, 3, 1], [10, len(decode_batch._NEXT) + 5000, 2]):
        out = decode_batch._successors(context)
        assert out == [c + 1 for c in context] and out is not context
    assert all(n == i + 1 for i, n in enumerate(decode_batch._NEXT))
