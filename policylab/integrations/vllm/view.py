"""policylab's `SchedulerView` over vLLM's own scheduler state, read live (no copies).

A policy reads requests through `RequestView`s and the cache through a block manager; both
are read here straight from vLLM: `LiveRequest` stands where the engine's `Request` stands
(its fields are properties over vLLM's `Request` and its block list), `LiveKV` where the
`BlockManager` stands (free blocks, reference counts and prefix-cache lookups of vLLM's
block pool). So the view of a step costs what the policy reads, and `validate_plan` checks a
plan against exactly the numbers vLLM will allocate from.

This is the one module that knows how policylab's view is built; everything else in the
integration goes through `build_view` and `hits_of`.
"""
from __future__ import annotations

from types import MappingProxyType

from policylab.core.contract import DecodeFacts, RequestView, SchedulerView
from policylab.core.request import Status

_EMPTY = ()


class BlockIds:
    """A request's block table as block ids, over vLLM's live list of `KVCacheBlock`s."""

    __slots__ = ("_blocks",)

    def __init__(self, blocks):
        self._blocks = blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def __bool__(self) -> bool:
        return bool(self._blocks)

    def __iter__(self):
        return (b.block_id for b in self._blocks)

    def __reversed__(self):
        return (b.block_id for b in reversed(self._blocks))


class RefCounts:
    """`ref[block_id]`: vLLM's reference count of a block."""

    __slots__ = ("_blocks",)

    def __init__(self, blocks):
        self._blocks = blocks

    def __getitem__(self, block_id: int) -> int:
        return self._blocks[block_id].ref_cnt


class LiveKV:
    """The read side of policylab's `BlockManager`, answered by vLLM's KV cache manager.

    vLLM keeps block 0 as a null block that no request ever holds, so the usable total is one
    less than the pool. A prefix-cache lookup is vLLM's own (`find_longest_cache_hit` of the
    single full-attention group); the hits are kept so that the scheduler adopts exactly the
    blocks the policy planned with.
    """

    def __init__(self, kv_cache_manager, block_size: int):
        self.manager = kv_cache_manager
        self.pool = kv_cache_manager.block_pool
        self.coordinator = kv_cache_manager.coordinator
        self.block_size = block_size
        self.num_blocks = self.pool.num_gpu_blocks - 1
        self.prefix_caching = bool(kv_cache_manager.enable_caching)
        self.ref = RefCounts(self.pool.blocks)
        self.epoch = 0
        self._req_to_blocks = self.coordinator.single_type_managers[0].req_to_blocks

    @property
    def num_free(self) -> int:
        return self.pool.get_num_free_blocks()

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def blocks_of(self, request_id: str):
        """vLLM's live block list of a request (empty when it holds none; never creates one)."""
        return self._req_to_blocks.get(request_id, _EMPTY)

    def lookup(self, hashes, max_blocks: int) -> tuple:
        if not self.prefix_caching or max_blocks <= 0 or not hashes:
            return ()
        blocks, _, _ = self.coordinator.find_longest_cache_hit(hashes, max_blocks * self.block_size)
        return tuple(b.block_id for b in blocks[0])

    def reclaim_cost(self, block_ids) -> int:
        blocks = self.pool.blocks
        return sum(1 for b in block_ids if blocks[b].ref_cnt == 0)

    def freed_by_release(self, table) -> int:
        blocks = self.pool.blocks
        return sum(1 for b in table if blocks[b].ref_cnt == 1)

    def block(self, block_id: int):
        return self.pool.blocks[block_id]


def _status(live: "LiveRequest") -> Status:
    from vllm.v1.request import RequestStatus
    s = live.vllm.status
    if s == RequestStatus.RUNNING:
        return Status.RUNNING
    if RequestStatus.is_finished(s):
        return Status.REJECTED if live.reject_reason else Status.FINISHED
    return Status.WAITING


class LiveRequest:
    """Stands where policylab's engine `Request` stands behind a `RequestView`: every field is
    read from vLLM's `Request` when asked. What vLLM does not keep (client, SLOs, token times)
    the scheduler records here."""

    __slots__ = ("req_id", "vllm", "_kv", "client", "ttft_slo", "tpot_slo", "predicted_output_tokens",
                 "first_scheduled_time", "token_times", "arrival_time", "reject_reason")

    def __init__(self, req_id: int, vllm_request, kv: LiveKV, arrival_time: float, meta: dict):
        self.req_id, self.vllm, self._kv, self.arrival_time = req_id, vllm_request, kv, arrival_time
        self.client = str(meta.get("client", "default"))
        self.ttft_slo, self.tpot_slo = meta.get("ttft_slo"), meta.get("tpot_slo")
        self.predicted_output_tokens = meta.get("predicted_output_tokens")
        self.first_scheduled_time = None
        self.token_times: list = []
        self.reject_reason = ""

    priority = property(lambda s: s.vllm.priority)
    max_tokens = property(lambda s: s.vllm.max_tokens)
    prompt_ids = property(lambda s: s.vllm.prompt_token_ids)
    output_ids = property(lambda s: s.vllm.output_token_ids)
    num_tokens = property(lambda s: s.vllm.num_tokens)
    num_computed_tokens = property(lambda s: s.vllm.num_computed_tokens)
    num_preemptions = property(lambda s: s.vllm.num_preemptions)
    block_table = property(lambda s: BlockIds(s._kv.blocks_of(s.vllm.request_id)))
    status = property(_status)

    @property
    def block_hashes(self):
        v = self.vllm
        return _EMPTY if v.skip_reading_prefix_cache else v.block_hashes


def new_request_view(live: LiveRequest, kv: LiveKV) -> RequestView:
    return RequestView(live, kv)


def hits_of(view: RequestView) -> tuple:
    """The prefix-cache block ids this waiting request was planned with (memoized this step)."""
    return view.cached_blocks()


def build_view(clock: float, step: int, waiting: tuple, running: tuple, running_requests: list,
               max_num_batched_tokens: int, max_num_seqs: int, kv: LiveKV, by_id: dict, sampled,
               arrived) -> SchedulerView:
    """One step's view: `waiting` and `running` are RequestViews in policylab's orders (preempted
    first, latest preemption first, then arrivals; running in the order they started), and
    `running_requests` vLLM's requests behind `running`, in the same order (read directly: the
    decoding set is one pass over plain attributes)."""
    bs, blocks_of = kv.block_size, kv.blocks_of
    running_ids = tuple(v.req_id for v in running)
    decoding, needs_block = {}, {}
    for rid, r in zip(running_ids, running_requests):
        computed = r.num_computed_tokens
        if computed == r.num_tokens - 1 and r.num_output_tokens:     # policylab's RequestView.is_decode
            decoding[rid] = 1
            if len(blocks_of(r.request_id)) * bs <= computed:
                needs_block[rid] = None
    return SchedulerView(
        clock=clock, step=step, waiting=waiting, running=running, decoding=frozenset(decoding),
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        block_size=bs, num_free_blocks=kv.num_free, num_total_blocks=kv.num_blocks,
        by_id=MappingProxyType(by_id), sampled=tuple(sampled), arrived=tuple(arrived),
        decode=DecodeFacts(frozenset(needs_block), tuple(decoding)))
