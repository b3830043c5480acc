"""The radix-tree prefix index (`engine.prefix_cache=radix`): the same hits as the chained-hash
map wherever both apply, leaf-first eviction, and the invariant harness on Mooncake-style traces."""
from __future__ import annotations

import dataclasses

import pytest

from policylab.core.config import EngineConfig
from policylab.core.kv.blocks import BlockPool
from policylab.core.kv.radix import RadixTree
from policylab.testing.harness import Scenario, fingerprint, run_checked
from policylab.testing.kv_traces import mooncake_style

pytestmark = pytest.mark.timeout(300)
SEGMENT = 32          # tokens per trace hash id (Mooncake's hash_ids cover 512; scaled down)


def replay(trace, engine: EngineConfig, index: str, policy: str = "chunked"):
    return run_checked(policy, Scenario(trace, dataclasses.replace(engine, prefix_cache=index),
                                        prefix_block_tokens=SEGMENT))


ROOMY = EngineConfig(block_size=8, num_blocks=4000, max_num_batched_tokens=256, max_num_seqs=16, max_model_len=1024)


@pytest.mark.parametrize("seed", [0, 1])
def test_radix_gives_the_hash_maps_hits_on_mooncake_style_traces(seed):
    trace = mooncake_style(60, seed)
    hashed, radix = replay(trace, ROOMY, "hash"), replay(trace, ROOMY, "radix")
    assert sum(r.num_cached_tokens_total for r in hashed.requests) > 0
    assert fingerprint(radix) == fingerprint(hashed)


@pytest.mark.parametrize("seed", [0, 1])
def test_radix_under_eviction_pressure_passes_the_harness(seed):
    trace = mooncake_style(60, seed, rate=200.0)
    tight = dataclasses.replace(ROOMY, num_blocks=120)
    hashed, radix = replay(trace, tight, "hash"), replay(trace, tight, "radix")
    hits = lambda res: sum(r.num_cached_tokens_total for r in res.requests)
    assert hits(radix) > 0 and hits(hashed) > 0
    first_hits = lambda res: sum(r.num_cached_tokens_total for r in res.requests if not r.num_preemptions)
    roomy = replay(trace, ROOMY, "radix")
    assert first_hits(radix) < first_hits(roomy)          # the small cache evicted prefixes others wanted
    assert all(r.output_ids for r in radix.requests if r.status.value == "finished")


def _chain_with_a_newer_leaf(index: str) -> tuple:
    """A cache whose free parent block is older than its free child: block 0 (label 1) freed
    first, block 2 (label 2, continuing label 1) freed after it; blocks 1 and 3 plain."""
    kv = BlockPool(4, 4, True, index)
    first = []
    kv.grow(first, 4)
    kv.register(first, [1], 4)
    second = []
    kv.grow(second, 8)                    # its own copy of label 1's tokens, then label 2
    kv.register(second, [1, 2], 8)        # label 1 is cached already: only label 2 is published
    kv.release(first)
    kv.release(second)
    return kv


@pytest.mark.parametrize("index, survives", [("hash", ()), ("radix", (0,))])
def test_radix_evicts_leaves_first(index, survives):
    kv = _chain_with_a_newer_leaf(index)
    assert kv.lookup([1, 2], 2) == (0, 2)
    table = []
    kv.grow(table, 12)                    # both plain blocks and one cached one
    assert kv.lookup([1, 2], 2) == survives
    kv.check()


def test_tree_sets_aside_children_of_an_evicted_block_and_reattaches_them():
    tree = RadixTree()
    tree.insert("a", None, 0)
    tree.insert("b", "a", 1)
    tree.insert("c", "b", 2)
    assert tree.lookup(["a", "b", "c"], 3) == (0, 1, 2) and not tree.is_leaf("b") and tree.is_leaf("c")
    tree.remove("b")
    assert tree.lookup(["a", "b", "c"], 3) == (0,)
    tree.check({"a": 0, "c": 2})
    tree.insert("b", "a", 5)
    assert tree.lookup(["a", "b", "c"], 3) == (0, 5, 2)
    tree.check({"a": 0, "b": 5, "c": 2})
    assert tree.lookup(["a", "b", "c"], 2) == (0, 5)


def test_an_unknown_index_is_refused():
    from policylab.core.config import check_engine_config
    with pytest.raises(ValueError, match="engine.prefix_cache"):
        check_engine_config(EngineConfig(prefix_cache="trie"))


@pytest.mark.parametrize("policy", ["chunked", "dfs_weight"])
def test_torch_plane_radix_hits_and_greedy_tokens_equal_the_hash_maps_and_no_cache(policy):
    """A tiny model on the torch plane: prompts that share a prefix hit the radix index, and the
    greedy tokens equal those of the chained-hash map and of prefix caching off (a hit reads the
    KV the prefix computed)."""
    pytest.importorskip("torch")
    from policylab.core.engine import Engine
    from policylab.core.request import TraceRequest
    from policylab.dataplane.torch_plane import TorchDataPlane
    from policylab.testing.loader import load_policy
    from tests.test_dataplane_model import SMALL, dataplane

    trace = [TraceRequest(arrival_time=0.004 * i, prompt_tokens=p, output_tokens=6, prefix_hashes=h)
             for i, (p, h) in enumerate(((20, (1, 2)), (22, (1, 2, 3)), (18, (1, 4)), (9, ()), (24, (1, 2, 5))))]
    outputs, cached = {}, {}
    for name, caching, index in (("radix", True, "radix"), ("hash", True, "hash"), ("off", False, "hash")):
        cfg = EngineConfig(block_size=4, num_blocks=40, max_num_batched_tokens=32, max_num_seqs=4, max_model_len=128,
                           check_invariants=True, enable_prefix_caching=caching, prefix_cache=index)
        plane = TorchDataPlane.from_config(dataplane(), SMALL, seed=0)
        result = Engine(trace, load_policy(policy), plane, cfg, seed=0, prefix_block_tokens=8).run()
        assert result.status == "complete", result.error
        outputs[name] = [r.output_ids for r in result.requests]
        cached[name] = sum(r.num_cached_tokens_total for r in result.requests)
    assert cached["radix"] == cached["hash"] > 0 and cached["off"] == 0
    assert outputs["radix"] == outputs["hash"] == outputs["off"]
    assert all(len(o) == t.output_tokens for o, t in zip(outputs["radix"], trace))
