"""The sums the sim plane takes once a step and hands to the cost model and the energy meter (the
leading decodes' count, the batch's context): every price is the same float as without them."""
from __future__ import annotations

import random

import pytest

from policylab.apps.sim_check import load_group
from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.config import SimPlaneConfig
from policylab.dataplane.energy import StepWork
from policylab.dataplane.serving_engine import ServingEngineConfig
from policylab.dataplane.shape import ModelShape
from policylab.dataplane.sim import build_cost_model

pytestmark = pytest.mark.timeout(120)

LLAMA = load_group("model", "llama3-8b", ModelConfig)
H100 = load_group("hardware", "h100", HardwareConfig)


def batches(seed: int, count: int) -> list:
    """(q, ctx, leading) with leading one-token decodes, then chunks and stray one-token entries."""
    rng, out = random.Random(seed), []
    for _ in range(count):
        d = rng.choice((0, 1, rng.randint(2, 200)))
        rest = [rng.choice((1, rng.randint(2, 4096))) for _ in range(rng.randint(0 if d else 1, 4))]
        q = [1] * d + rest
        ctx = [rng.randint(0, 30000) for _ in q]
        out.append((q, ctx, d))
    return out


@pytest.mark.parametrize("cost_model", ["shaped", "roofline", "kernel"])
def test_attention_and_step_time_with_the_plane_s_sums_are_the_same_floats(cost_model):
    for engine in (None, load_group("serving_engine", "vllm", ServingEngineConfig)):
        dp = SimPlaneConfig(cost_model=cost_model, **({"serving_engine": engine} if engine else {}))
        model = build_cost_model(LLAMA, H100, dp)
        for q, ctx, d in batches(1, 300):
            tokens = sum(q)
            want = model.attention_time(q, ctx, tokens)
            assert model.attention_time(q, ctx, tokens, d, sum(ctx)).hex() == want.hex()
            sampled = len(q)
            assert model.step_time(q, ctx, tokens, sampled, d, sum(ctx)).hex() == \
                model.step_time(q, ctx, tokens, sampled).hex()


def test_a_step_s_work_with_the_plane_s_context_sum_is_the_same():
    work = StepWork(ModelShape(LLAMA))
    for q, ctx, d in batches(2, 300):
        tokens = sum(q)
        assert work.of(q, ctx, tokens, len(q), d, sum(ctx)) == work.of(q, ctx, tokens, len(q), d)
        assert work.of(q, ctx, tokens, len(q), d) == work.of(q, ctx, tokens, len(q))


def test_sampled_ids_are_the_ids_after_each_sampled_entry_s_last_token():
    """The gather by context (the leading decodes' position) with the other entries redone gives each
    sampled entry the id after its last computed token, as token_at does, across the id table's growth."""
    from policylab.core.batch import Batch
    from policylab.dataplane.sim import SimDataPlane
    plane = SimDataPlane(LLAMA, H100, SimPlaneConfig())
    rng = random.Random(3)
    for q, ctx, d in batches(3, 200):
        sample = [True] * d + [rng.random() < 0.7 for _ in q[d:]]
        b = Batch(req_ids=list(range(len(q))), query_lens=q, context_lens=ctx, sample=sample, decodes=d)
        want = [plane.token_at(c + n - 1) for c, n, s in zip(ctx, q, sample) if s]
        fresh = SimDataPlane(LLAMA, H100, SimPlaneConfig())            # (its table grows on this batch)
        assert plane.execute(b).sampled == want == fresh.execute(b).sampled
