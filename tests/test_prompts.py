"""Synthetic prompt ids: deterministic, clear of special tokens, shared only where the trace says."""
import numpy as np

from policylab.core.synthetic_prompts import _KEY_TOKENS, _POOL_TOKENS, _RESERVED, _window, synthesize_prompt


def test_the_same_request_and_seed_give_the_same_ids_and_another_seed_does_not():
    a, b = synthesize_prompt(3, 700, (9,), 32000, seed=0), synthesize_prompt(3, 700, (9,), 32000, seed=0)
    assert a.dtype == np.int32 and len(a) == 700 and (a == b).all()
    assert (a != synthesize_prompt(3, 700, (9,), 32000, seed=1)).mean() > 0.9
    other = synthesize_prompt(4, 700, (9,), 32000, seed=0)      # the same 512-token prefix segment
    assert (a[:512] == other[:512]).all() and (a[512:] != other[512:]).mean() > 0.9


def test_ids_stay_clear_of_the_special_tokens_at_the_bottom_of_the_vocabulary():
    for vocab in (256, 32000):
        ids = np.concatenate([synthesize_prompt(i, 300, (i % 3,), vocab, prefix_block_tokens=64)
                              for i in range(50)])
        assert ids.min() >= _RESERVED and ids.max() < vocab


def test_two_streams_at_the_same_pool_offset_still_begin_apart():
    """Offsets are the key modulo the pool: keys that collide there differ in their first ids,
    so no prefix-cache chain (which starts at the first block) is shared by accident."""
    k1 = 12345
    k2 = k1 + 7 * _POOL_TOKENS
    a, b = _window(k1, 64, 32000, 0), _window(k2, 64, 32000, 0)
    assert (a[:_KEY_TOKENS] != b[:_KEY_TOKENS]).any() and (a[_KEY_TOKENS:] == b[_KEY_TOKENS:]).all()


def test_a_stream_longer_than_the_pool_wraps_around_it():
    ids = _window(5, _POOL_TOKENS + 100, 32000, 0)
    assert len(ids) == _POOL_TOKENS + 100 and (ids[_POOL_TOKENS + 10:] == ids[10:100]).all()


def test_a_synthetic_prompt_reads_as_the_ids_it_stands_for():
    from policylab.core.synthetic_prompts import SyntheticPrompt
    args = (3, 700, (9,), 32000, 0, 512)
    ids, lazy = synthesize_prompt(*args), SyntheticPrompt(*args)
    assert len(lazy) == 700 and (np.asarray(lazy) == ids).all() and np.asarray(lazy, np.int64).dtype == np.int64
    assert (lazy[500:517] == ids[500:517]).all() and (lazy[690:] == ids[690:]).all()


def test_a_sim_replay_holds_no_prompt_ids_yet_hashes_and_publishes_the_same_blocks():
    """The sim plane reads no token ids, so a waiting or running request keeps a SyntheticPrompt
    (~100 bytes) instead of its ids; its prefix hashes, cache hits and output-block hashes are
    those of the ids (a plane that reads ids gets the array, and the same hashes)."""
    from policies.prefill_first import PrefillFirst
    from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
    from policylab.dataplane.config import DataplaneConfig
    from policylab.core.engine import Engine
    from policylab.core.request import TraceRequest as T
    from policylab.core.capabilities import Capability
    from policylab.core.synthetic_prompts import SyntheticPrompt
    from policylab.dataplane.sim import SimDataPlane

    class ReadsIds(SimDataPlane):
        def __init__(self, *args):
            super().__init__(*args)
            self.capabilities = self.capabilities | {Capability.TOKEN_IDS}

    trace = [T(0.0, 70, 9, prefix_hashes=(5,)), T(0.0, 70, 9, prefix_hashes=(5,)), T(9.0, 70, 3, prefix_hashes=(5,))]
    cfg = EngineConfig(block_size=16, num_blocks=64, max_num_batched_tokens=256, max_num_seqs=4)
    runs = {}
    for plane in (SimDataPlane, ReadsIds):
        engine = Engine(trace, PrefillFirst(), plane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim")),
                        cfg, prefix_block_tokens=32)
        engine._arrive(0)
        kind = type(engine.requests[0].prompt_ids)
        result = Engine(trace, PrefillFirst(), engine.dataplane, cfg, prefix_block_tokens=32).run()
        runs[plane] = (kind, [list(r.block_hashes) for r in result.requests],
                       [r.num_cached_tokens_total for r in result.requests])
    assert runs[SimDataPlane][0] is SyntheticPrompt and runs[ReadsIds][0] is np.ndarray
    assert runs[SimDataPlane][1:] == runs[ReadsIds][1:]
    assert runs[SimDataPlane][2][2] >= 32       # the third request hit the shared 32-token prefix


def test_any_range_of_a_prompt_is_made_alone_as_the_same_ids():
    from policylab.core.synthetic_prompts import SyntheticPrompt
    for args in ((3, 700, (9,), 32000, 0, 512), (5, 1300, (1, 2, 3), 256, 2, 200), (7, 3, (), 32000, 0, 512)):
        ids, lazy = synthesize_prompt(*args), SyntheticPrompt(*args)
        n = args[1]
        for a, b in ((0, n), (0, 2), (1, 5), (3, 4), (n - 1, n), (199, 401), (200, 200), (n, n + 9), (-5, None)):
            assert lazy[a:b].tolist() == ids[a:b].tolist(), (args, a, b)
            if 0 <= a <= n and b is not None:
                assert synthesize_prompt(*args, start=a, stop=b).tolist() == ids[a:b].tolist()


def test_own_prompts_keyed_without_hashing_hit_exactly_as_their_chained_hashes_do(monkeypatch):
    """A prompt of its own (synthesized, no trace prefix) is keyed by kv.own_block_keys, not by
    hashing its ids: under preemption (recompute hits its own prompt and output blocks) and
    beside requests that share trace prefixes, every request, step and cache hit is the same as
    with the chained hashes of its ids."""
    import dataclasses

    from policies.chunked import Chunked
    from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
    from policylab.dataplane.config import DataplaneConfig
    from policylab.core.engine import Engine
    from policylab.core.kv import chain_hashes, own_block_keys
    from policylab.core.request import TraceRequest as T
    from policylab.dataplane.sim import SimDataPlane

    rng = np.random.default_rng(3)
    trace = [T(float(t), int(p), int(o), prefix_hashes=((1,) if k % 3 == 0 else ()))
             for k, (t, p, o) in enumerate(zip(np.sort(rng.uniform(0, 2, 60)), rng.integers(20, 200, 60),
                                               rng.integers(5, 120, 60)))]
    cfg = EngineConfig(block_size=8, num_blocks=40, max_num_batched_tokens=128, max_num_seqs=12)

    def replay():
        plane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"))
        result = Engine(trace, Chunked(chunk_size=64), plane, cfg, prefix_block_tokens=32).run()
        return ([(r.status, r.token_times, r.num_cached_tokens_total, r.num_preemptions) for r in result.requests],
                {k: list(v) for k, v in result.steps.items()}, result.requests)

    keyed, keyed_steps, requests = replay()
    own = [r for r in requests if not trace[r.req_id].prefix_hashes]
    assert own and all(r.own_prompt for r in own)
    preempted = next(r for r in own if r.num_preemptions)   # keyed when preempted, not hashed
    assert len(preempted.block_hashes) >= 2 and list(preempted.block_hashes) == \
        list(own_block_keys(0, preempted.req_id, 0, len(preempted.block_hashes)))
    assert list(preempted.block_hashes[:2]) != chain_hashes(np.asarray(preempted.prompt_ids), 8)[:2]
    assert not next(r for r in own if not r.num_preemptions).block_hashes      # never published
    monkeypatch.setattr(T, "own_prompt", property(lambda self: False))
    hashed, hashed_steps, _ = replay()
    assert sum(r.num_preemptions for r in own) > 3 and sum(r.num_cached_tokens_total for r in own) > 0
    assert keyed == hashed and keyed_steps == hashed_steps
