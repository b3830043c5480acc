"""Speculative decoding: the contract's rules for StepPlan.spec_tokens, verification on the sim
(acceptance model, KV of rejected drafts released, hidden output length respected), the
invariant harness with drafts under every shipped policy, and the summary's counters."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from policies.prefill_first import PrefillFirst
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.core.contract import ContractViolation, StepPlan
from policylab.core.engine import Engine
from policylab.core.kv import blocks_for
from policylab.core.policy import Policy
from policylab.core.request import TraceRequest
from policylab.core.extensions.speculation import SpeculativeConfig, ngram_drafts
from policylab.core.speculative_plan import FixedSpeculation
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.sim import SimDataPlane
from policylab.dataplane.speculative import SimSpeculation, geometric_accepted
from policylab.testing import check_policy
from policylab.testing.loader import policy_factory, shipped_policy_configs, spec_id
from policylab.testing.suite import pressure_scenario

pytestmark = pytest.mark.timeout(300)


def sim(alpha: float = 0.7, seed: int = 0) -> SimDataPlane:
    plane = SimDataPlane(ModelConfig(), HardwareConfig(step_overhead=0.004), DataplaneConfig(kind="sim"), seed)
    plane.speculation = SimSpeculation(SpeculativeConfig(acceptance_rate=alpha), seed)
    return plane


# ------------------------------------------------------------------ contract
# After the first step request 0 (8-token prompt, max_tokens 8) decodes and holds 2 of 3 blocks
# (block size 4): its token takes the last free block; by max_tokens it may take 6 drafts.
TRACE = [TraceRequest(0.0, 8, 4, max_tokens=8), TraceRequest(0.0, 4, 4)]
CFG = EngineConfig(block_size=4, num_blocks=3, max_num_batched_tokens=8, max_num_seqs=2)
BAD = {
    "spec_type": lambda: StepPlan({0: 1}, spec_tokens={0: 1.0}),
    "spec_nonneg": lambda: StepPlan({0: 1}, spec_tokens={0: -1}),
    "spec_decoding": lambda: StepPlan({0: 1, 1: 4}, spec_tokens={1: 2}),
    "spec_max_tokens": lambda: StepPlan({0: 1}, spec_tokens={0: 7}),
    "token_budget": lambda: StepPlan({0: 1, 1: 4}, spec_tokens={0: 4}),
    "kv_capacity": lambda: StepPlan({0: 1}, spec_tokens={0: 5}),
}


class Scripted(Policy):
    def __init__(self, plan):
        super().__init__("scripted")
        self.plan = plan

    def schedule(self, view):
        return StepPlan({0: 8}) if view.step == 0 else self.plan()


@pytest.mark.parametrize("rule", sorted(BAD))
def test_each_broken_speculative_rule_is_named_and_nothing_is_committed(rule):
    engine = Engine(TRACE, Scripted(BAD[rule]), sim(), CFG)
    engine.step()
    before = (engine.kv.num_free, engine.clock.now, [len(r.output_ids) for r in engine.requests if r])
    with pytest.raises(ContractViolation) as caught:
        engine.step()
    assert (caught.value.rule, caught.value.policy) == (rule, "scripted")
    assert (engine.kv.num_free, engine.clock.now, [len(r.output_ids) for r in engine.requests if r]) == before


def test_the_rules_of_check_spec_tokens_all_have_a_breaking_plan():
    import inspect
    import re
    from policylab.core import spec_rules
    rules = set(re.findall(r'ContractViolation\(policy, "(\w+)"', inspect.getsource(spec_rules.check_spec_tokens)))
    assert rules <= set(BAD) and len(rules) == 4


@pytest.mark.timeout(30)
@pytest.mark.parametrize("k", [3, 4])
def test_drafts_take_the_kv_of_their_token_plus_k_across_a_block_boundary(k):
    """After step 0 request 0 holds its 8 computed tokens in 2 full blocks and 1 block is free.
    Its token and k drafts write positions 8 .. 8 + k: k = 3 fills the free block exactly and runs;
    k = 4 puts a fifth token into a block that is not there and is refused (k drafts alone would fit)."""
    engine = Engine(TRACE, Scripted(lambda: StepPlan({0: 1}, spec_tokens={0: k})), sim(alpha=1.0), CFG)
    engine.step()
    r, bs = engine.requests[0], CFG.block_size
    assert (r.num_computed_tokens, len(r.block_table), engine.kv.num_free) == (8, 2, 1)
    needed = blocks_for(r.num_computed_tokens + 1 + k, bs) - len(r.block_table)
    assert blocks_for(r.num_computed_tokens + k, bs) - len(r.block_table) <= engine.kv.num_free
    if needed <= engine.kv.num_free:
        engine.step()
        assert engine.extension("speculation").stats["proposed_tokens"] == k
    else:
        with pytest.raises(ContractViolation) as caught:
            engine.step()
        assert caught.value.rule == "kv_capacity" and f"needs {needed} KV blocks" in caught.value.detail


def test_a_plan_that_fits_its_drafts_runs_and_a_zero_k_is_a_plain_decode():
    trace, cfg = [TraceRequest(0.0, 8, 8, max_tokens=8)], dataclasses.replace(CFG, num_blocks=4)
    engine = Engine(trace, Scripted(lambda: StepPlan({0: 1}, spec_tokens={0: 3})), sim(alpha=1.0), cfg)
    engine.step()
    engine.step()
    r = engine.requests[0]
    assert len(r.output_ids) == 5 and r.num_computed_tokens == 12     # 1 + 3 accepted + 1 bonus
    assert len(set(r.token_times)) == 2                              # the step's tokens share its time
    plain = Engine(trace, Scripted(lambda: StepPlan({0: 1}, spec_tokens={0: 0})), sim(), cfg)
    plain.step()
    plain.step()
    assert len(plain.requests[0].output_ids) == 2 and plain.extension("speculation").stats["proposed_tokens"] == 0


# ------------------------------------------------------------------ the sim's verification
def run(policy, trace, alpha=0.7, k=None, cfg=None, seed=0):
    cfg = cfg or EngineConfig(block_size=8, num_blocks=400, max_num_batched_tokens=512, check_invariants=True)
    engine = Engine(trace, policy if k is None else FixedSpeculation(policy, k), sim(alpha, seed), cfg, seed=seed)
    result = engine.run()
    assert result.status == "complete", result.error
    return engine, result


TRACE_B = [TraceRequest(0.01 * i, 30 + 7 * i, 40 + 3 * i, max_tokens=400) for i in range(12)]


def test_speculation_emits_the_plain_tokens_in_fewer_steps_and_releases_every_block():
    _, plain = run(PrefillFirst(), TRACE_B)
    engine, spec = run(PrefillFirst(), TRACE_B, k=3)
    assert [r.output_ids for r in spec.requests] == [r.output_ids for r in plain.requests]
    assert len(spec.steps["clock"]) < 0.7 * len(plain.steps["clock"])
    stats = engine.extension("speculation").stats
    assert stats["accepted_tokens"] + stats["rejected_tokens"] == stats["proposed_tokens"] > 0
    assert stats["released_blocks"] > 0 and engine.kv.num_free == engine.kv.num_blocks


def test_acceptance_follows_the_geometric_model():
    alpha, k = 0.6, 4
    counts = np.bincount([geometric_accepted(3, rid, pos, k, alpha) for rid in range(40) for pos in range(100)],
                         minlength=k + 1) / 4000
    want = [alpha ** a * (1 - alpha) for a in range(k)] + [alpha ** k]
    assert np.allclose(counts, want, atol=0.03)
    assert geometric_accepted(3, 1, 5, k, 0.0) == 0 and geometric_accepted(3, 1, 5, k, 1.0) == k


def test_alpha_one_accepts_every_draft_and_alpha_zero_none():
    engine, _ = run(PrefillFirst(), TRACE_B, alpha=1.0, k=3)
    s = engine.extension("speculation").stats
    assert s["rejected_tokens"] < 0.05 * s["proposed_tokens"]        # only drafts past a request's end
    engine, _ = run(PrefillFirst(), TRACE_B, alpha=0.0, k=3)
    s = engine.extension("speculation").stats
    assert s["accepted_tokens"] == 0 and s["emitted_tokens"] == s["verifications"]


def test_a_trace_acceptance_rate_wins_over_the_config():
    trace = [dataclasses.replace(t, spec_acceptance=1.0 if i % 2 else 0.0) for i, t in enumerate(TRACE_B)]
    engine, result = run(PrefillFirst(), trace, alpha=0.5, k=2)
    steps = {}
    for r in result.requests:                  # each request's distinct token times: its decode steps
        steps[r.req_id] = len(set(r.token_times))
    assert all(steps[i] == len(result.requests[i].output_ids) for i in range(0, 12, 2))   # alpha 0: 1 a step
    assert all(steps[i] <= len(result.requests[i].output_ids) // 3 + 2 for i in range(1, 12, 2))


def test_the_engine_clamps_to_the_hidden_output_length():
    trace = [TraceRequest(0.0, 20, 5, max_tokens=500)]     # the policy only knows max_tokens
    engine, result = run(PrefillFirst(), trace, alpha=1.0, k=8)
    assert len(result.requests[0].output_ids) == 5
    assert engine.extension("speculation").stats["rejected_tokens"] > 0


def test_draft_model_pricing_adds_the_drafts_steps():
    from policylab.dataplane.roofline import Roofline
    base, _ = run(PrefillFirst(), TRACE_B, alpha=0.7, k=2)
    engine = Engine(TRACE_B, FixedSpeculation(PrefillFirst(), 2), sim(0.7), EngineConfig(block_size=8, num_blocks=400))
    engine.dataplane.speculation = SimSpeculation(SpeculativeConfig(method="draft", draft_model="tiny",
                                                                    acceptance_rate=0.7), 0,
                                                  Roofline(ModelConfig(), HardwareConfig(step_overhead=0.004)))
    priced = engine.run()
    assert [r.output_ids for r in priced.requests] == [r.output_ids for r in base.requests]
    assert priced.steps["duration"].sum() > base.steps["duration"].sum() * 1.5   # 2 draft steps of 4 ms each


def test_same_seed_same_replay_and_acceptance_depends_on_the_seed():
    a, ra = run(PrefillFirst(), TRACE_B, k=2, seed=1)
    b, rb = run(PrefillFirst(), TRACE_B, k=2, seed=1)
    c, _ = run(PrefillFirst(), TRACE_B, k=2, seed=2)
    assert a.extension("speculation").stats == b.extension("speculation").stats
    assert [r.token_times for r in ra.requests] == [r.token_times for r in rb.requests]
    assert a.extension("speculation").stats != c.extension("speculation").stats


def test_ngram_drafts_continue_the_latest_match():
    tokens = np.array([5, 6, 7, 8, 9, 5, 6, 7])
    assert ngram_drafts(tokens, 2).tolist() == [8, 9]
    assert ngram_drafts(np.array([1, 2, 3]), 2).tolist() == []
    assert ngram_drafts(np.array([4, 1, 2, 4]), 3).tolist() == [1, 2, 4]


# ------------------------------------------------------------------ invariant harness
SHIPPED = shipped_policy_configs()


@pytest.mark.parametrize("spec", SHIPPED, ids=[spec_id(s) for s in SHIPPED])
def test_invariants_hold_with_fixed_k_under_every_shipped_policy(spec):
    factory = policy_factory(spec)
    if "speculation" in getattr(factory(), "features", ()):   # a policy that sizes its own drafts
        with pytest.raises(ValueError, match=r"^speculative.k=3 and policy \w+ both choose draft tokens"):
            FixedSpeculation(factory(), 3)
        return
    for seed in (0, 1):
        scenario = pressure_scenario(seed)
        check_policy(lambda: FixedSpeculation(factory(), 3), scenario)


def test_the_harness_catches_unreleased_draft_kv(monkeypatch):
    """A verification that keeps its rejected drafts' blocks breaks the `speculation` invariant."""
    from policylab.core.extensions import speculation as speculative
    from policylab.testing.properties import InvariantViolation
    real = speculative.blocks_for
    monkeypatch.setattr(speculative, "blocks_for", lambda n, bs: real(n, bs) + 1)
    with pytest.raises(InvariantViolation, match="speculation"):
        check_policy(lambda: FixedSpeculation(PrefillFirst(), 3), pressure_scenario(0), determinism=False)


def test_blocks_left_after_a_step_cover_the_computed_tokens_only():
    engine = Engine(TRACE_B, FixedSpeculation(PrefillFirst(), 4), sim(0.5), EngineConfig(block_size=4, num_blocks=600))
    for _ in range(60):
        engine.step()
        for r in engine.running:
            assert len(r.block_table) == blocks_for(r.num_computed_tokens, 4)


# ------------------------------------------------------------------ spec_adaptive
def test_spec_adaptive_gives_the_most_drafts_at_low_load_and_none_in_a_huge_batch():
    from policies.spec_adaptive import SpecAdaptive
    p = SpecAdaptive()
    ks = [p.best_k(b, 0) for b in (1, 8, 64, 128, 256, 512)]
    assert ks[0] == ks[1] == 4 and ks[-1] == 0 and ks == sorted(ks, reverse=True) and 0 < ks[3] < 4
    p.successes, p.failures = 0, 1000                  # drafts never accepted: none while they cost
    assert p.best_k(128, 0) == 0
    assert SpecAdaptive(draft_cost=0.5).best_k(1, 0) < 4   # priced drafts


def test_spec_adaptive_measures_the_acceptance_of_the_run():
    from policies.spec_adaptive import SpecAdaptive
    trace = [TraceRequest(0.05 * i, 40, 300, max_tokens=1000) for i in range(8)]
    for alpha in (0.3, 0.8):
        policy = SpecAdaptive()
        run(policy, trace, alpha=alpha, cfg=EngineConfig(block_size=8, num_blocks=800, max_num_batched_tokens=512))
        assert policy.acceptance == pytest.approx(alpha, abs=0.06)


def test_speculation_keeps_its_accepted_drafts_on_steps_that_move_prefix_tier_blocks():
    """A step that also copies prefix-cache blocks between tiers keeps what its verification
    accepted: the tokens equal a plain replay's, and drafts were accepted on such steps."""
    trace = [TraceRequest(0.02 * i, 64 + 5 * (i % 4), 30 + 2 * i, prefix_hashes=((i % 3, 48),), max_tokens=400)
             for i in range(24)]
    cfg = EngineConfig(block_size=8, num_blocks=48, max_num_batched_tokens=256, enable_prefix_caching=True,
                       prefix_host_blocks=64, check_invariants=True)
    _, plain = run(PrefillFirst(), trace, cfg=cfg)
    engine, spec = run(PrefillFirst(), trace, k=3, cfg=cfg)
    assert [r.output_ids for r in spec.requests] == [r.output_ids for r in plain.requests]
    assert engine.kv.stats["host_bytes"] > 0 and engine.extension("speculation").stats["accepted_tokens"] > 0
    stats = engine.extension("speculation").stats
    assert stats["accepted_tokens"] + stats["rejected_tokens"] == stats["proposed_tokens"]
