"""Fixed replays, fixed digests: a change meant to be behaviour-neutral (a faster policy, a
leaner engine, streamed results) must leave every request's fate exactly as it was.

Each shipped policy replays two small scenarios on the sim plane: one with ample KV and one
so short of KV blocks that requests are preempted and recomputed; the digest covers every
column of `requests.parquet` (token times included, floats as repr). When a change alters
behaviour on purpose, re-derive the digests and say why in the commit.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest
import yaml

from policylab.analysis.results import write_results
from policylab.core.config import EngineConfig, ModelConfig
from policylab.core.engine import Engine
from policylab.core.request import TraceRequest
from policylab.dataplane.sim import SimDataPlane
from policylab.testing.loader import CONFIG_DIR, load_policy
from policylab.testing.replay import SCENARIO_HARDWARE, scenario_dataplane

DIGESTS = {       # policy: (ample KV, short KV)
    "prefill_first": ("433a87c9deedd724", "24f85fcc1a560dc7"),
    "decode_first": ("4cf28592fd32dc09", "a23c86f8e3c19670"),
    "chunked": ("e5eaa3d2dec81829", "9beaaf6a7b9584f5"),
    "slo_aware": ("b7bd689a9c7fe08f", "8f23f84399f83171"),
    "fairness": ("e1cf99aa95f3cee2", "693d582a5f6eb590"),
    "priority": ("0b46a0d07c11a64a", "ca8eedbc7bb9a10d"),
    "sjf": ("8cf3df1c3d442372", "21baf4ae945f8349"),
}


PINNED = {"prefill_first": {"watermark": 0.0}}   # the digests predate prefill_first's watermark


def scenario(seed: int) -> list:
    """90 requests from 3 clients in bursts: priorities, per-request SLOs, long-tailed lengths."""
    rng = np.random.default_rng(seed)
    n = 90
    arrivals = np.cumsum(rng.exponential(0.004, n) * rng.choice([0.2, 5.0], n, p=[0.8, 0.2]))
    prompts = np.clip(rng.lognormal(4.5, 0.9, n), 4, 900).astype(int)
    outputs = np.clip(rng.lognormal(3.0, 0.8, n), 1, 120).astype(int)
    clients = rng.choice(["a", "b", "c"], n, p=[0.6, 0.25, 0.15])
    return [TraceRequest(float(t), int(p), int(o), client=str(c), priority=int(i % 3),
                         ttft_slo=0.3 if i % 4 == 0 else None, tpot_slo=0.03 if i % 5 == 0 else None,
                         prefix_hashes=(int(i % 2),) if p >= 64 else ())
            for i, (t, p, o, c) in enumerate(zip(arrivals, prompts, outputs, clients))]


def sim_plane() -> SimDataPlane:
    model = ModelConfig(**yaml.safe_load((CONFIG_DIR / "model" / "llama3-8b.yaml").read_text()))
    return SimDataPlane(model, SCENARIO_HARDWARE, scenario_dataplane(SCENARIO_HARDWARE))   # fixed across refits


SHORT_KV = {"decode_first": 32}    # it admits only into a drained batch: at 70 blocks it never preempts


def replay_digest(policy_name: str, num_blocks: int, tmp_path) -> tuple:
    """(digest of requests.parquet, preemptions) of the scenario on `num_blocks` KV blocks."""
    cfg = EngineConfig(num_blocks=num_blocks, max_num_batched_tokens=384, max_num_seqs=16,
                       predictor="oracle", predictor_noise=0.3)
    spec = yaml.safe_load((CONFIG_DIR / "policy" / f"{policy_name}.yaml").read_text())
    policy = load_policy({**spec, **PINNED.get(policy_name, {})})
    engine = Engine(scenario(7), policy, sim_plane(), cfg, seed=3, prefix_block_tokens=64)
    result = engine.run()
    assert result.status == "complete", result.error
    write_results(tmp_path, result)
    # QoE is left out: it is derived from the token times hashed here (checked by tests/test_qoe.py)
    table = pd.read_parquet(tmp_path / "requests.parquet").drop(columns=["qoe"])
    digest = hashlib.sha256(table.to_csv(index=False, float_format=repr).encode()).hexdigest()[:16]
    return digest, sum(r.num_preemptions for r in result.requests)


@pytest.mark.parametrize("policy_name", sorted(DIGESTS))
def test_replays_are_unchanged(policy_name, tmp_path):
    ample, short = DIGESTS[policy_name]
    assert replay_digest(policy_name, 4000, tmp_path / "ample")[0] == ample
    digest, preemptions = replay_digest(policy_name, SHORT_KV.get(policy_name, 70), tmp_path / "short")
    assert preemptions > 0, "the short-KV scenario must preempt"
    assert digest == short
