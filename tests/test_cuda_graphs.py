"""The CUDA-graph decode runner's plain logic on CPU: the ladder of batch sizes, the bucket of a
step, the padding of its inputs, the slicing of results, which steps replay, and when graphs are
on. The runner's end-to-end replay is checked in tests/test_triton_attention.py (interpreter)."""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from policylab.core.batch import Batch
from policylab.dataplane.cuda_graphs import (DecodeGraphRunner, StaticDecodeBuffers, bucket_for, cuda_graphs_wanted,
                                             decode_inputs, graph_batch_sizes, sampled_rows)
from tests.test_dataplane_model import entry


def test_ladder_is_nano_vllms():
    assert graph_batch_sizes(256) == [1, 2, 4, 8] + list(range(16, 257, 16))
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16]
    assert graph_batch_sizes(4) == [1, 2, 4]


@pytest.mark.parametrize("n,bucket", [(1, 1), (3, 4), (8, 8), (9, 16), (17, 32), (250, 256), (256, 256), (257, None)])
def test_bucket_is_the_smallest_size_that_holds_the_step(n, bucket):
    assert bucket_for(n, graph_batch_sizes(256)) == bucket


def decodes(contexts, tables, tokens=None) -> Batch:
    batch = Batch()
    for i, (ctx, table) in enumerate(zip(contexts, tables)):
        entry(batch, i, [tokens[i] if tokens else 100 + i], ctx, table)
    return batch


def test_decode_inputs_pad_to_the_bucket_with_harmless_rows():
    # block size 4: context 5 sits in its 2nd block, 0 (a one-token prompt) in the 1st, 12 in the 4th
    batch = decodes([5, 0, 12], [[7, 3], [9], [2, 6, 1, 8]], tokens=[11, 22, 33])
    got = decode_inputs(batch, block_size=4, bucket=8)
    assert got.input_ids.tolist() == [11, 22, 33] + [0] * 5
    assert got.positions.tolist() == [5, 0, 12] + [0] * 5
    assert got.slot_mapping.tolist() == [3 * 4 + 1, 9 * 4 + 0, 8 * 4 + 0] + [-1] * 5
    assert got.seq_lens.tolist() == [6, 1, 13] + [1] * 5
    assert got.block_tables.tolist() == [[7, 3, 0, 0], [9, 0, 0, 0], [2, 6, 1, 8]]
    assert got.input_ids.dtype == got.slot_mapping.dtype == np.int64 and got.seq_lens.dtype == np.int32


def test_a_short_block_table_is_the_same_clear_error_as_eager():
    with pytest.raises(ValueError, match="cannot hold 9 tokens"):
        decode_inputs(decodes([5, 8], [[7, 3], [1, 2]]), block_size=4, bucket=2)


def test_static_buffers_take_a_step_and_keep_the_rest():
    buffers = StaticDecodeBuffers(max_batch=8, width=6, vocab_size=5, dtype=torch.float32, device=torch.device("cpu"))
    buffers.block_tables.fill_(4)                                  # what an earlier, wider step left
    buffers.fill(decode_inputs(decodes([5, 12], [[7, 3], [2, 6, 1, 8]]), block_size=4, bucket=2))
    assert buffers.block_tables[:2, :4].tolist() == [[7, 3, 0, 0], [2, 6, 1, 8]]
    assert (buffers.block_tables[:2, 4:] == 4).all()               # past seq_lens: never read
    assert buffers.seq_lens.tolist() == [6, 13] + [1] * 6 and buffers.slot_mapping[2:].eq(-1).all()
    packed = buffers.packed(4, block_size=4)
    assert packed.input_ids.data_ptr() == buffers.input_ids.data_ptr() and len(packed.input_ids) == 4
    assert packed.block_tables.shape == (4, 6) and packed.query_lens.tolist() == [1] * 4


def test_results_are_sliced_to_the_real_and_sampled_rows():
    logits = torch.arange(8 * 3, dtype=torch.float32).view(8, 3)
    assert torch.equal(sampled_rows(logits, 3, None), logits[:3])
    assert torch.equal(sampled_rows(logits, 3, [True, True, True]), logits[:3])
    assert torch.equal(sampled_rows(logits, 3, [True, False, True]), logits[[0, 2]])
    kept = sampled_rows(logits, 2, None)
    logits.zero_()                                                 # the next replay overwrites the buffer
    assert kept.sum() > 0


def fake_model():
    """Stands in for CausalLM: logits [rows, 3] filled with the number of rows it was run on."""
    def model(packed, kv_caches, backend, all_logits):
        return torch.full((len(packed.input_ids), 3), float(len(packed.input_ids)))
    model.cfg, model.lm_head = types.SimpleNamespace(vocab_size=3), types.SimpleNamespace(weight=torch.zeros(1))
    return model


def runner(max_batch: int, capture=lambda step: step) -> DecodeGraphRunner:
    return DecodeGraphRunner(fake_model(), [], None, block_size=4, max_len=16, device=torch.device("cpu"),
                             capture=capture, max_batch=max_batch)


def test_runner_captures_every_bucket_and_replays_the_steps_own():
    captured = []
    r = runner(16, capture=lambda step: captured.append(step) or step)
    assert len(captured) == 5 and sorted(r.replays) == [1, 2, 4, 8, 16] and r.width == 4
    assert r.run(decodes([5, 1, 2], [[1, 2], [3], [4]])).tolist() == [[4.0] * 3] * 3    # 3 replay the graph of 4
    assert r.run(decodes([5] * 9, [[1, 2]] * 9)).tolist() == [[16.0] * 3] * 9


def test_only_decode_only_steps_within_the_ladder_and_width_replay():
    r = runner(8)
    assert r.accepts(decodes([5] * 8, [[1, 2]] * 8))
    assert not r.accepts(decodes([5] * 9, [[1, 2]] * 9))           # past the ladder
    assert not r.accepts(decodes([16], [[1, 2, 3, 4, 5]]))          # wider than the captured table
    assert not r.accepts(entry(decodes([5], [[1, 2]]), 7, [1, 2, 3], 0, [9]))   # a prefill rides along
    assert not r.accepts(Batch())


def test_graphs_are_on_by_default_on_cuda_with_a_graph_safe_backend(capsys):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    safe, eager = types.SimpleNamespace(name="triton", graph_safe_decode=True), types.SimpleNamespace(name="torch")
    assert cuda_graphs_wanted(None, cuda, safe) and cuda_graphs_wanted(True, cuda, safe)
    assert not cuda_graphs_wanted(False, cuda, safe)
    assert capsys.readouterr().out == ""
    assert not cuda_graphs_wanted(None, cpu, safe) and capsys.readouterr().out == ""
    assert not cuda_graphs_wanted(True, cpu, safe)
    assert capsys.readouterr().out.strip() == "[policylab] dataplane.cuda_graphs is ignored on CPU: decodes run eagerly"
    assert not cuda_graphs_wanted(None, cuda, eager) and "attention=triton" in capsys.readouterr().out
    assert not cuda_graphs_wanted(False, cuda, eager) and capsys.readouterr().out == ""
