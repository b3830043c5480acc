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
