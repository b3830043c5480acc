"""CUDA-graph decode runner: decode-only steps replay a captured forward instead of launching it.

A small model's decode step is bound by kernel launches and Python (3.8-4.2 ms for 32 decodes
of the tiny model on an H200 with eager launches). As nano-vLLM and vLLM do, the runner captures
the forward of a decode-only batch once per size of a ladder (1, 2, 4, 8, 16, 32, ...), over
static input buffers and a block table of fixed width. A step of n decodes pads to the next
size, copies its inputs into the buffers, replays, and keeps the first n rows; every other step
runs eagerly. The engine never sees the difference: same batch in, same logits out.

The ladder, the padding and the slicing are plain functions that CPU tests cover; only
`capture_cuda_graph` needs a GPU (the tests pass a capture that just calls the step).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from policylab.core.batch import Batch
from policylab.dataplane.packing import PackedInput

GRAPH_MAX_BATCH = 256      # larger decode batches run eagerly (their launches are amortized anyway)


def cuda_graphs_wanted(setting: Optional[bool], device: torch.device, backend) -> bool:
    """`dataplane.cuda_graphs`: None (default) means on wherever graphs can run; one line says why not."""
    if device.type != "cuda":
        if setting:
            print("[policylab] dataplane.cuda_graphs is ignored on CPU: decodes run eagerly")
        return False
    if not getattr(backend, "graph_safe_decode", False):
        if setting is not False:
            print(f"[policylab] CUDA graphs need dataplane.attention=triton (this run: {backend.name}): "
                  "decodes run eagerly")
        return False
    return setting is not False


def graph_batch_sizes(max_batch: int) -> list:
    """nano-vLLM's ladder: 1, 2, 4, 8, then every multiple of 16 up to max_batch."""
    return [s for s in (1, 2, 4, 8) if s <= max_batch] + list(range(16, max_batch + 1, 16))


def bucket_for(n: int, sizes: list) -> Optional[int]:
    """The smallest captured size that holds n decodes; None if none does."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


@dataclass
class DecodeInputs:
    """One decode-only step's inputs, padded to its bucket (block tables: the real rows only)."""
    input_ids: np.ndarray      # [bucket] int64, 0 on padding rows
    positions: np.ndarray      # [bucket] int64, 0 on padding rows
    slot_mapping: np.ndarray   # [bucket] int64, -1 on padding rows: their K/V are never written
    seq_lens: np.ndarray       # [bucket] int32, 1 on padding rows: they attend to one harmless key
    block_tables: np.ndarray   # [n, widest table of the step] int32


def _pad(x: np.ndarray, size: int, value, dtype) -> np.ndarray:
    out = np.full(size, value, dtype=dtype)
    out[:len(x)] = x
    return out


def decode_inputs(batch: Batch, block_size: int, bucket: int) -> DecodeInputs:
    n = len(batch)
    ctx = np.asarray(batch.context_lens, dtype=np.int64)          # each entry's one query sits at ctx
    lengths = np.fromiter((len(t) for t in batch.block_tables), dtype=np.int64, count=n)
    short = np.nonzero(lengths * block_size <= ctx)[0]
    if len(short):                                                 # as pack() says it
        i = int(short[0])
        raise ValueError(f"batch entry {i} (req {batch.req_ids[i]}): {lengths[i]} KV blocks cannot "
                         f"hold {int(ctx[i]) + 1} tokens at block_size={block_size}")
    tables = np.zeros((n, lengths.max()), dtype=np.int32)
    for i, t in enumerate(batch.block_tables):
        tables[i, :len(t)] = t
    slots = tables[np.arange(n), ctx // block_size].astype(np.int64) * block_size + ctx % block_size
    return DecodeInputs(input_ids=_pad(np.concatenate(batch.token_ids), bucket, 0, np.int64),
                        positions=_pad(ctx, bucket, 0, np.int64), slot_mapping=_pad(slots, bucket, -1, np.int64),
                        seq_lens=_pad(ctx + 1, bucket, 1, np.int32), block_tables=tables)


def sampled_rows(logits: torch.Tensor, n: int, sample: Optional[list]) -> torch.Tensor:
    """The real rows of a padded output (a copy: the static buffer is overwritten by the next
    replay), only those of sampled entries unless `sample` is None."""
    if sample is None or all(sample):
        return logits[:n].clone()
    return logits[torch.as_tensor(np.nonzero(sample)[0], device=logits.device)]


class StaticDecodeBuffers:
    """The tensors a captured graph reads and writes: filled before each replay, never reallocated."""

    def __init__(self, max_batch: int, width: int, vocab_size: int, dtype: torch.dtype, device: torch.device):
        self.input_ids = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((max_batch,), -1, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(max_batch, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(max_batch, width, dtype=torch.int32, device=device)
        self.logits = torch.zeros(max_batch, vocab_size, dtype=dtype, device=device)

    def fill(self, inputs: DecodeInputs) -> None:
        """Stale table columns past a row's table are never read (keys stop at seq_lens)."""
        bucket, (n, width) = len(inputs.input_ids), inputs.block_tables.shape
        for buf, x in ((self.input_ids, inputs.input_ids), (self.positions, inputs.positions),
                       (self.slot_mapping, inputs.slot_mapping), (self.seq_lens, inputs.seq_lens)):
            buf[:bucket].copy_(torch.from_numpy(x))
        self.block_tables[:n, :width].copy_(torch.from_numpy(inputs.block_tables))

    def packed(self, bucket: int, block_size: int) -> PackedInput:
        """A decode-only PackedInput over the first `bucket` rows; a graph-safe backend's plan reads
        only input_ids, positions, slot_mapping, block_tables, seq_lens and query_lens."""
        rows = np.arange(bucket)
        unused = self.seq_lens[:0]
        return PackedInput(input_ids=self.input_ids[:bucket], positions=self.positions[:bucket],
                           slot_mapping=self.slot_mapping[:bucket], block_tables=self.block_tables[:bucket],
                           seq_lens=self.seq_lens[:bucket], cu_seqlens_q=unused, cu_seqlens_k=unused,
                           logits_indices=unused.long(), query_lens=np.ones(bucket, dtype=np.int64),
                           query_starts=rows, context_lens=np.zeros(bucket, dtype=np.int64),
                           block_tables_np=np.zeros((bucket, 0), dtype=np.int32), block_size=block_size)


def capture_cuda_graph(pool) -> Callable:
    """A capture function for DecodeGraphRunner: warm up (Triton compiles, the allocator settles),
    then record the step into a CUDA graph whose memory comes from the shared `pool`."""
    def capture(step: Callable[[], None]) -> Callable[[], None]:
        step()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            step()
        return graph.replay
    return capture


class DecodeGraphRunner:
    """Captures the model's decode-only forward for every bucket (largest first, so the smaller
    graphs fit in the memory pool the largest one reserved) and replays the step's bucket."""

    def __init__(self, model, kv_caches: list, backend, block_size: int, max_len: int, device: torch.device,
                 capture: Callable, max_batch: int = GRAPH_MAX_BATCH):
        self.block_size, self.width = block_size, -(-max_len // block_size)
        self.sizes = graph_batch_sizes(max_batch)
        dtype = model.lm_head.weight.dtype
        self.buffers = StaticDecodeBuffers(self.sizes[-1], self.width, model.cfg.vocab_size, dtype, device)
        self.replays = {}
        for bucket in reversed(self.sizes):
            packed = self.buffers.packed(bucket, block_size)

            def step(packed=packed, bucket=bucket):
                self.buffers.logits[:bucket] = model(packed, kv_caches, backend, all_logits=True)
            self.replays[bucket] = capture(step)

    def accepts(self, batch: Batch) -> bool:
        """Decode-only, within the ladder, and every block table within the captured width."""
        return (0 < len(batch) <= self.sizes[-1] and all(n == 1 for n in batch.query_lens)
                and max(len(t) for t in batch.block_tables) <= self.width)

    def run(self, batch: Batch, all_logits: bool = False) -> torch.Tensor:
        bucket = bucket_for(len(batch), self.sizes)
        self.buffers.fill(decode_inputs(batch, self.block_size, bucket))
        self.replays[bucket]()
        return sampled_rows(self.buffers.logits, len(batch), None if all_logits else batch.sample)
