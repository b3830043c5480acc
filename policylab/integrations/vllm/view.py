"""policylab's `SchedulerView` over vLLM's own scheduler state, read live (no copies).

A policy reads requests through `RequestView`s and the cache through a block manager; both
are read here straight from vLLM: `LiveRequest` stands where the engine's `Request` stands
(its fields are properties over vLLM's `Request` and its block list), `LiveKV` where the
`KVManager` stands (free blocks, reference counts and prefix-cache lookups of vLLM's
block pool). So the view of a step costs what the policy reads, and `validate_plan` checks a
plan against exactly the numbers vLLM will allocate from.

This is the one module that knows how policylab's view is built; everything else in the
integration goes through `build_view` and `hits_of`.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from policylab.core.contract import DecodeFacts, RequestView, SchedulerView
from policylab.core.kv.cost import new_blocks, plan_cost
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
    """vLLM's live reference counts by block id, indexed as `KVManager`'s own list is."""

    __slots__ = ("_blocks",)

    def __init__(self, blocks):
        self._blocks = blocks

    def __getitem__(self, b: int) -> int:
        return self._blocks[b].ref_cnt


class CacheMap(Mapping):
    """vLLM's prefix cache as policylab's `cache_map`: block hash -> block id (read-only; a hash
    that several blocks carry names one of them, the one vLLM's own lookup would take)."""

    __slots__ = ("_cache",)

    def __init__(self, block_hash_to_block):
        self._cache = block_hash_to_block._cache

    def __getitem__(self, block_hash) -> int:
        blocks = self._cache[block_hash]
        return blocks.block_id if not isinstance(blocks, dict) else next(iter(blocks))

    def __iter__(self):
        return iter(self._cache)

    def __len__(self) -> int:
        return len(self._cache)


class LiveKV:
    """policylab's `KVManager` cost queries, answered by vLLM's KV cache manager.

    vLLM keeps block 0 as a null block that no request ever holds, so the usable total is one
    less than the pool. A prefix-cache lookup is vLLM's own (`find_longest_cache_hit` of the
    single full-attention group) and is remembered until the next step starts (`new_step`):
    nothing between a plan and its execution evicts a cached block (preempting or rejecting
    only frees blocks, which keep their hashes), so the scheduler adopts exactly the blocks the
    policy planned with. Every answer has `KVManager`'s meaning, read from vLLM's reference
    counts and free-block count, so `validate_plan` checks a plan against the numbers vLLM
    allocates from.
    """

    def __init__(self, kv_cache_manager, block_size: int):
        self.manager = kv_cache_manager
        self.pool = kv_cache_manager.block_pool
        self.coordinator = kv_cache_manager.coordinator
        self.block_size = block_size
        self.num_blocks = self.pool.num_gpu_blocks - 1
        self.prefix_caching = bool(kv_cache_manager.enable_caching)
        self.sharing = False            # vLLM serves no copy-on-write forks or prefix tiers here (refused before
                                        # it starts)
        self.publishes_on_schedule = False   # the scheduler adopts the hits the policy planned with, taken
                                             # before the step allocates (`view.remaining_tokens_after`)
        self._blocks = self.pool.blocks
        self._ref_counts = RefCounts(self._blocks)
        self._req_to_blocks = self.coordinator.single_type_managers[0].req_to_blocks
        self._hits: dict = {}            # req_id -> its cache hits, this step

    def new_step(self) -> None:
        """Forget this step's cache lookups: vLLM's cache may have changed since."""
        if self._hits:
            self._hits.clear()

    @property
    def num_free(self) -> int:
        return self.pool.get_num_free_blocks()

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def blocks_of(self, request_id: str):
        """vLLM's live block list of a request (empty when it holds none; never creates one)."""
        return self._req_to_blocks.get(request_id, _EMPTY)

    def block(self, block_id: int):
        return self._blocks[block_id]

    def lookup(self, hashes, max_blocks: int) -> tuple:
        """vLLM's longest run of cached blocks matching `hashes` (at most max_blocks), as ids."""
        if not self.prefix_caching or max_blocks <= 0 or not hashes:
            return ()
        blocks, _, _ = self.coordinator.find_longest_cache_hit(hashes, max_blocks * self.block_size)
        return tuple(b.block_id for b in blocks[0])

    # ---------------------------------------------- cost questions (the view and the validator ask)
    def hits(self, r) -> tuple:
        """Prefix-cache blocks request `r` (a `LiveRequest`) would reuse if it started now: none
        once it holds KV or has computed tokens; its last known token is always left to compute
        (vLLM's `get_computed_blocks`)."""
        if r.num_computed_tokens or r.block_table:
            return ()
        blocks = self._hits.get(r.req_id)
        if blocks is None:
            blocks = self._hits[r.req_id] = self.lookup(r.block_hashes, (r.num_tokens - 1) // self.block_size)
        return blocks

    def cached_keys(self, r) -> tuple:
        """`hits(r)` as policies compare them: vLLM's block ids."""
        return self.hits(r)

    def write_copies(self, writes, preempted=()) -> int:
        """No block is shared by forks here: no copy-on-write."""
        return 0

    def blocks_needed(self, r, n: int) -> int:
        """Free blocks that giving `n` more tokens to request `r` consumes (its cache hits included:
        a hit on a block nobody holds takes it out of vLLM's free queue)."""
        hits = () if r.block_table else self.hits(r)
        blocks = self._blocks
        return new_blocks(r, n, hits, self.block_size) + sum(1 for b in hits if blocks[b].ref_cnt == 0)

    def freed_by(self, r) -> int:
        """Blocks that preempting request `r` frees: those no other request holds."""
        return sum(1 for b in r.block_table if self._blocks[b].ref_cnt == 1)

    def plan_cost(self, preempted: list, chunks) -> tuple:
        """(blocks needed, blocks available) of giving `chunks` ((request, tokens) pairs) their tokens
        once the `preempted` requests have released their tables: `core.kv.plan_cost` over vLLM's
        reference counts."""
        return plan_cost(self._ref_counts, self.num_free, self.block_size, self.hits, preempted, chunks)

    # ------------------------------------------------------------------ read-only state for checks
    @property
    def refs(self) -> tuple:
        """Every block's reference count, by block id (vLLM's null block 0 counts as unheld)."""
        return (0, *(b.ref_cnt for b in self._blocks[1:]))

    @property
    def cache_map(self) -> CacheMap:
        """vLLM's prefix cache, block hash -> block id (read-only)."""
        return CacheMap(self.pool.cached_block_hash_to_block)

    def holds(self, b: int) -> bool:
        """Whether some request's block table holds block `b`."""
        return b > 0 and self._blocks[b].ref_cnt > 0


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

    swapped_blocks = 0           # vLLM's scheduler here keeps no host tier: nothing is ever swapped out
    priority = property(lambda s: s.vllm.priority)
    max_tokens = property(lambda s: s.vllm.max_tokens)
    prompt_ids = property(lambda s: s.vllm.prompt_token_ids)
    prompt_len = property(lambda s: s.vllm.num_prompt_tokens)
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
