"""The usual step's shortcuts (every decode, then one prefill chunk) against the general paths they
stand for: the same blocks, the same totals, the same violations."""
from __future__ import annotations

import numpy as np
import pytest

from policies.chunked import Chunked
from policylab.core import plan_rules
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.core.contract import ContractViolation, StepPlan, _decode
from policylab.core.engine import Engine
from policylab.core.kv import chain_hashes
from policylab.core.kv.blocks import BlockPool
from policylab.core.request import TraceRequest
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.sim import SimDataPlane


def _pool_in_use(seed: int, index: str) -> tuple:
    """A small pool after random requests came and went (plain blocks, runs of unhittable blocks and
    hashed blocks in the LRU, some held), and tables whose last block is full."""
    rng = np.random.default_rng(seed)
    kv, bs, held = BlockPool(40, 2, True, index), 2, []
    if seed % 2:                       # every block once used and freed into runs: no plain one left
        table = []
        kv.grow(table, 40 * bs)
        kv.release(table, 40)
    for k in range(30):
        if held and (rng.random() < 0.45 or kv.num_free < 8):
            table, n = held.pop(int(rng.integers(len(held))))
            kv.release(table, n // bs if seed % 2 or rng.random() < 0.5 else 0)
            continue
        n = int(rng.integers(1, 7)) * bs
        if kv.num_free < n // bs:
            continue
        table = []
        kv.grow(table, n)
        if rng.random() < 0.5:
            kv.register(table, chain_hashes(np.arange(100 * k, 100 * k + n, dtype=np.int32), bs), n)
        held.append((table, n))
    return kv, [table for table, _ in held]


@pytest.mark.parametrize("index", ["hash", "radix"])
@pytest.mark.parametrize("seed", range(12))
def test_grow_each_takes_the_blocks_that_grow_one_would_take_one_after_the_other(seed, index):
    one_by_one, tables = _pool_in_use(seed, index)
    together, same_tables = _pool_in_use(seed, index)
    k = min(len(tables), one_by_one.num_free)
    for table in tables[:k]:
        one_by_one.grow_one(table)
    together.grow_each(same_tables[:k])
    together.check()
    assert same_tables == tables and together.refs == one_by_one.refs
    assert together.free_cached_blocks() == one_by_one.free_cached_blocks()
    assert dict(together.cache_map) == dict(one_by_one.cache_map)
    assert together.num_free == one_by_one.num_free


def test_grow_each_takes_from_a_long_run_of_unhittable_blocks_as_grow_one_does():
    """No plain block left and a run at the LRU's front longer than the tables: its last blocks, in
    the order grow_one takes them, and the run keeps the rest."""
    pools = []
    for _ in range(2):
        kv, table = BlockPool(40, 2), []
        kv.grow(table, 80)
        kv.release(table, 40)                    # every block in one run
        tables = [[], [], []]
        for t in tables:
            kv.grow(t, 4)
        pools.append((kv, tables))
    (one_by_one, tables), (together, same_tables) = pools
    for t in tables:
        one_by_one.grow_one(t)
    together.grow_each(same_tables)
    together.check()
    assert same_tables == tables and together.refs == one_by_one.refs
    assert together.free_cached_blocks() == one_by_one.free_cached_blocks() and together.num_free == 31


def test_grow_each_refuses_more_tables_than_free_blocks_and_takes_nothing():
    kv, tables = BlockPool(4, 2), [[], [], [], [], []]
    with pytest.raises(MemoryError):
        kv.grow_each(tables)
    assert kv.num_free == 4 and tables == [[], [], [], [], []]


class _Probe(Chunked):
    """chunked, checking at every step that each plan of every decode plus one entry gets from
    `check_plan` what the entry-by-entry check gives it: its totals, or the same broken rule."""

    def __init__(self):
        super().__init__(chunk_size=48)
        self.compared = self.refused = 0

    def schedule(self, view):
        decodes, live = view.decode_tokens(), view.by_id
        if decodes:
            for rid, v in live.items():
                if rid in decodes:
                    continue
                rem = v.remaining_tokens
                for n in (1, rem, rem + 1, 0, True, 2.0):
                    self._compare(view, StepPlan({**decodes, rid: n}))
            others = [rid for rid in live if rid not in decodes][:3]
            for a, b in zip(others, others[1:]):        # two chunks
                ra, rb = live[a].remaining_tokens, live[b].remaining_tokens
                for na, nb in ((ra, rb), (1, rb + 1), (ra, 0), (True, 1)):
                    self._compare(view, StepPlan({**decodes, a: na, b: nb}))
            self._compare(view, StepPlan({**decodes, 10**6: 1}))
            self._compare(view, StepPlan({**decodes, next(iter(decodes)): 1}))   # (a key again: a dict keeps one)
        return super().schedule(view)

    def _compare(self, view, plan):
        def outcome(check):
            try:
                return check()
            except ContractViolation as e:
                self.refused += 1
                return e.rule
        leading = len(view.decoding)
        fast = outcome(lambda: plan_rules.check_plan(view, plan))
        decode = _decode(view)
        with_chunks = plan_rules._prefill_chunks(view, plan, decode, leading) \
            if len(plan.num_scheduled_tokens) > leading else ()
        general = outcome(lambda: _general(view, plan))
        assert fast == general, (plan.num_scheduled_tokens, fast, general)
        if with_chunks:
            assert with_chunks == plan_rules._check_entries(view, plan, "policy", leading)
        self.compared += 1


def _general(view, plan):
    """check_plan without its prefill-chunk shortcut."""
    saved = plan_rules._prefill_chunks
    plan_rules._prefill_chunks = lambda *a: ()
    try:
        return plan_rules.check_plan(view, plan)
    finally:
        plan_rules._prefill_chunks = saved


def test_the_prefill_chunk_check_agrees_with_the_entry_by_entry_check_in_every_state_of_a_replay():
    rng = np.random.default_rng(5)
    trace = [TraceRequest(float(t), int(p), int(o), prefix_hashes=((3,), ())[k % 2])
             for k, (t, p, o) in enumerate(zip(np.sort(rng.uniform(0, 0.05, 24)), rng.integers(20, 120, 24),
                                               rng.integers(5, 40, 24)))]
    policy = _Probe()
    plane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"))
    engine = Engine(trace, policy, plane, EngineConfig(block_size=8, num_blocks=40, max_num_batched_tokens=64,
                                                       max_num_seqs=8), prefix_block_tokens=16)
    result = engine.run()
    assert result.status == "complete", result.error
    assert policy.compared > 200 and policy.refused > 100


def _replay_facts(general: bool, publish: bool) -> tuple:
    """A small replay with shared prefixes (starts on cache hits) and a tight pool, through the commit's
    shortcut for the entries after the decodes or (`general`) always through `_commit_requests`: each
    request's timeline and KV facts, every step's row, how many starts on cache hits and how many
    starts next to other entries went through the shortcut."""
    rng = np.random.default_rng(11)
    trace = [TraceRequest(float(t), int(p), int(o), prefix_hashes=((3, 4), (3,), (3, 4), ())[k % 4])
             for k, (t, p, o) in enumerate(zip(np.sort(rng.uniform(0, 2.0, 60)), rng.integers(20, 120, 60),
                                               rng.integers(100, 300, 60)))]
    plane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"))
    engine = Engine(trace, Chunked(chunk_size=48), plane,
                    EngineConfig(block_size=8, num_blocks=60, max_num_batched_tokens=64, max_num_seqs=8,
                                 publish_on_schedule=publish), prefix_block_tokens=16)
    shortcut, starts = engine._commit_entries, []

    def commit_entries(sched):
        if general:
            return None
        waiting = [engine.requests[rid] for rid in sched if engine.requests[rid].status.name == "WAITING"]
        parts = shortcut(sched)
        starts.append(parts is not None and any(r.num_cached_tokens_total for r in waiting))
        together.append(parts is not None and len(sched) > 1 and bool(waiting))
        return parts
    engine._commit_entries, together = commit_entries, []
    result = engine.run()
    assert result.status == "complete", result.error
    engine.kv.check()
    facts = [(r.first_scheduled_time, r.finish_time, r.num_cached_tokens_total, list(r.output_ids),
              list(r.token_times), r.num_preemptions) for r in engine.requests]
    return facts, engine.step_log.columns(), sum(starts), sum(together)


@pytest.mark.parametrize("publish", [False, True])
def test_entries_starting_through_the_commit_shortcut_replay_as_through_commit_requests(publish):
    facts, steps, started, with_chunks = _replay_facts(False, publish)
    general_facts, general_steps, _, _ = _replay_facts(True, publish)
    assert started > 3 and (with_chunks > 3 or publish), (started, with_chunks)
    assert facts == general_facts
    assert {k: list(v) for k, v in steps.items()} == {k: list(v) for k, v in general_steps.items()}


class _Keeper(Chunked):
    """chunked, keeping every view it is handed with what it showed then (running, its ids and the
    decode facts' running ids)."""

    def __init__(self):
        super().__init__(chunk_size=48)
        self.kept = []

    def schedule(self, view):
        self.kept.append((view, tuple(view.running), [v.req_id for v in view.running], list(_decode(view).running_ids)))
        return super().schedule(view)


def test_the_running_views_kept_up_to_date_incrementally_equal_a_rebuild_and_never_change_once_handed_out():
    rng = np.random.default_rng(3)
    trace = [TraceRequest(float(t), int(p), int(o))
             for t, p, o in zip(np.sort(rng.uniform(0, 1.0, 40)), rng.integers(20, 120, 40), rng.integers(5, 200, 40))]
    policy = _Keeper()
    plane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"))
    engine = Engine(trace, policy, plane, EngineConfig(block_size=8, num_blocks=120, max_num_batched_tokens=64,
                                                       max_num_seqs=8))
    view, rebuilt = engine._view, []

    def checked_view():
        v = view()
        rebuilt.append(v.running == tuple(engine.views[r.req_id] for r in engine.running))
        assert engine._running_ids == [r.req_id for r in engine.running]
        return v
    engine._view = checked_view
    assert engine.run().status == "complete"
    assert all(rebuilt) and len(rebuilt) > 100
    changed = sum(len(set(map(id, a[0].running)) ^ set(map(id, b[0].running))) > 0
                  for a, b in zip(policy.kept, policy.kept[1:]))
    assert changed > 40                              # running changed often: appends and removals
    for view, running, ids, facts_ids in policy.kept:     # (the decode facts' running ids too)
        assert view.running == running and [v.req_id for v in view.running] == ids == facts_ids
        assert _decode(view).running_ids == ids
