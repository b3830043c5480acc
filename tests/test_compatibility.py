"""Every combination composes or is refused: each pair of features (a feature alone too), on every
data plane (sim, torch, vllm) and topology (one engine, replicas, P/D), either runs with each
feature's effect visible in summary.json, or is refused before the run with one line naming both
(policylab.core.features; docs/compatibility.md is the same table). Nothing is dropped silently.

Every run is the user's: the run job as `policylab.replay` composes it, on a small trace written
here (16 requests sharing prefixes, under KV pressure), each feature turned on as a user turns
it on. The sim runs every cell in the fast tier; the torch plane is the slow tier; vLLM's cells
are all refusals (made before vLLM is imported, so they run anywhere).
"""
from __future__ import annotations

import json
from itertools import combinations_with_replacement

import pytest

import policylab
from policylab.apps.features_cli import PLANES, render_features, render_table
from policylab.apps.jobs import RunError
from policylab.core.features import FEATURES, TOPOLOGIES, composes

pytestmark = pytest.mark.timeout(300)

# a feature as a user turns it on: (a change to each trace record i, config overrides)
RECIPES = {
    "forks": (lambda i, rec: {**rec, "n": 2} if i % 4 == 1 else rec, []),
    "beams": (lambda i, rec: {**rec, "beam_width": 2} if i % 4 == 3 else rec, []),
    "tool_calls": (lambda i, rec: rec, ["+trace.tool_calls={calls: 1, duration_s: 0.02, fraction: 0.5}"]),
    "sessions": (lambda i, rec: rec, ["trace.concurrency=6"]),
    "speculation": (lambda i, rec: rec, ["speculative.k=2"]),
    "swap": (lambda i, rec: rec, ["policy.preempt_mode=swap", "engine.host_kv_blocks=400"]),
    "prefix_tiers": (lambda i, rec: rec, ["engine.prefix_host_blocks=64"]),
    "radix": (lambda i, rec: rec, ["engine.prefix_cache=radix"]),
    "client_timeout": (lambda i, rec: rec, ["trace.client_timeout=0.3"]),
}
# ... and where summary.json shows that it took effect
EFFECTS = {
    "forks": lambda s: s["forks"]["forked_requests"] > s["forks"]["beam_requests"],
    "beams": lambda s: s["forks"]["beam_requests"] > 0,
    "tool_calls": lambda s: s["programs"]["tool_calls"] > 0,
    "sessions": lambda s: s["sessions"]["users"] == 6 and s["sessions"]["count"] == 16,
    "speculation": lambda s: s["speculative"]["verifications"] > 0,
    "swap": lambda s: s["kv_hierarchy"]["swap_outs"] > 0,
    "prefix_tiers": lambda s: s["kv_hierarchy"]["host_offloaded_blocks"] > 0,
    "radix": lambda s: s["config"]["engine"]["prefix_cache"] == "radix" and s["prefix_cache_hit_rate"] > 0,
    "client_timeout": lambda s: s["client_timeout"]["abandoned"] > 0,
}
PLANE_ARGS = {"sim": ["dataplane=sim"], "torch": ["dataplane=torch", "model=tiny", "dataplane.step_time=model"],
              "vllm": ["dataplane=vllm"]}
TOPOLOGY_ARGS = {"engine": [], "replicas": ["cluster.replicas=2"],
                 "pd": ["cluster.prefill_replicas=1", "cluster.decode_replicas=1"]}
BASE = ["policy=chunked", "logger=none", "plots=false", "progress=false", "engine.num_blocks=40",
        "engine.block_size=16", "engine.max_num_seqs=8"]
PAIRS = list(combinations_with_replacement(FEATURES, 2))
# one engine in the fast tier; replicas and P/D (the same checks, a cluster's runs) in the slow one
TIERED = [t if t == "engine" else pytest.param(t, marks=pytest.mark.slow) for t in TOPOLOGIES]


def trace_file(path, change) -> str:
    """16 requests, 0.5 ms apart, three groups sharing a 64-token prefix, 60-200 output tokens."""
    with open(path, "w") as f:
        for i in range(16):
            rec = {"arrival_time": 0.0005 * i, "prompt_tokens": 96 + 8 * (i % 5), "output_tokens": 60 + 9 * i,
                   "prefix_hashes": [i % 3]}
            f.write(json.dumps(change(i, rec)) + "\n")
    return str(path)


def run_cell(a: str, b: str, plane: str, topology: str, tmp_path):
    """(summary, None) of the pair's run, or (None, the refusal's message)."""
    features = [a] if a == b else [a, b]
    change = lambda i, rec: RECIPES[features[-1]][0](i, RECIPES[features[0]][0](i, rec))  # noqa: E731
    overrides = [*BASE, *PLANE_ARGS[plane], *TOPOLOGY_ARGS[topology], "trace=file",
                 f"trace.path={trace_file(tmp_path / 'trace.jsonl', change)}",
                 *(o for f in features for o in RECIPES[f][1])]
    try:
        run = policylab.replay(None, None, *overrides, dir=tmp_path / "run")
    except (ValueError, RunError) as e:
        return None, str(e)
    return run.summary, None


def check_cell(a: str, b: str, plane: str, topology: str, tmp_path) -> None:
    why = composes({a, b}, PLANES[plane], plane, topology)
    summary, refusal = run_cell(a, b, plane, topology, tmp_path)
    if why:
        assert refusal == why, f"expected the refusal {why!r}, got {refusal or 'a run'}"
        # one line, naming what does not go: a feature, or (a cluster on vLLM) the plane
        assert "\n" not in refusal and any(name in refusal for name in (a, b, f"dataplane={plane}"))
        assert not (tmp_path / "run" / "summary.json").exists()
        return
    assert refusal is None, f"{a} + {b} on {plane}, {topology}: refused ({refusal}) but declared to compose"
    assert summary["status"] == "complete", summary["error"]
    assert summary["counts"]["finished"] + summary["counts"]["rejected"] == 16
    for feature in {a, b}:
        assert EFFECTS[feature](summary), f"{feature}'s effect is missing from summary.json ({a} + {b}, {plane}, {topology})"


@pytest.mark.parametrize("topology", TIERED)
@pytest.mark.parametrize("a,b", PAIRS, ids=[f"{a}+{b}" for a, b in PAIRS])
def test_every_pair_on_the_sim_composes_or_is_refused(a, b, topology, tmp_path):
    check_cell(a, b, "sim", topology, tmp_path)


@pytest.mark.parametrize("topology", TIERED)
@pytest.mark.parametrize("a,b", PAIRS, ids=[f"{a}+{b}" for a, b in PAIRS])
def test_every_pair_on_vllm_is_refused_before_vllm_loads(a, b, topology, tmp_path):
    check_cell(a, b, "vllm", topology, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("a,b", PAIRS, ids=[f"{a}+{b}" for a, b in PAIRS])
def test_every_pair_on_the_torch_plane_composes_or_is_refused(a, b, topology, tmp_path):
    check_cell(a, b, "torch", topology, tmp_path)


def test_the_docs_table_is_the_declarations():
    doc = open("docs/compatibility.md", encoding="utf-8").read()
    assert render_features() in doc and render_table() in doc
