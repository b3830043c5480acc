"""The running requests in decode: the engine's one record of which requests decode (DESIGN §2).

A running request decodes when its next step is exactly one token (`is_decoding`); it enters
when a step leaves it so and leaves when a step leaves it otherwise, or when its KV is
released (finished, preempted, rejected). Beside the ordered set of them this record keeps
those whose last KV block is full, so that giving every decode its token knows the blocks it
takes without a look at each request. The persistent decode batch is a private cache of it:
while the same requests decode step after step, their per-request lists are reused.
"""
from __future__ import annotations

from operator import attrgetter
from types import MappingProxyType

from policylab.core.batch import Batch
from policylab.core.capabilities import Capability
from policylab.core.contract import DecodeFacts
from policylab.core.decode_batch import DecodeBatch
from policylab.core.request import Request, is_decoding

_table = attrgetter("block_table")


class Decoding:
    """The decoding requests of one engine (ordered by when they began decoding), those whose last
    block is full, and the decode batch cached over them."""

    def __init__(self, requests: list, target_len: list, block_size: int, tokens=None):
        """`tokens`: the plane's positional ids, for a decode batch that defers them (DecodeBatch)."""
        self._requests, self.block_size = requests, block_size
        self._ids: dict = {}          # req_id -> 1: an ordered set (and the plan {each: 1} when in running order)
        self._full: dict = {}         # req_id -> None: decoding ones whose last block is full
        self.ids = MappingProxyType(self._ids).keys()      # live read-only sets (the view's facts)
        self.full = MappingProxyType(self._full).keys()
        self._batch = DecodeBatch(requests, target_len, block_size, tokens)
        # some of `ids` (a dict or set of req_ids) are members of the cached decode batch
        self.in_batch = self._batch.has_any
        self.facts = None             # the view's DecodeFacts (`make_facts`); None when running or decoding change
        self._order = None            # (ids in order, plan) of the last facts, while the decoding set stays
        self._removed = 0             # entries removed from `_ids` since it was last compacted
        self._batch_is_facts = False  # the batch's members are the facts' ids, in that order

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, rid: int) -> bool:
        return rid in self._ids

    @property
    def batch_ids(self) -> list:
        """The cached decode batch's members, in batch order."""
        return self._batch.req_ids

    @property
    def batch_requests(self) -> list:
        return self._batch.requests

    def make_facts(self, ids: list) -> DecodeFacts:
        """What the view states of them, from every running req_id in running order (`ids`): their
        ids in running order, and those with a full last block."""
        kept = self._order                  # (a start changes running only: the decodes' facts are kept)
        order = list(self._ids) if kept is None else kept[0]
        if order == ids[:len(order)]:       # they decode in running order, ahead of the prefills (mostly):
            if kept is None:                # the plan a copy
                self._order = kept = order, self._ids.copy()
            self.facts = DecodeFacts(self.full, order, running_ids=ids, plan=kept[1])
        else:
            self.facts = DecodeFacts(self.full, ids if len(ids) == len(order) else
                                     list(filter(self._ids.__contains__, ids)), running_ids=ids)
        return self.facts

    def running_changed(self) -> None:
        self.facts, self._batch_is_facts = None, False

    def update(self, r: Request) -> None:
        """Record a request a step just gave tokens one by one (a prefill chunk, or a decode off the
        cached batch): it decodes from now on, or not."""
        rid = r.req_id
        if not is_decoding(r):        # (decoding also covers a recompute one token short of the end)
            return self.discard(rid)
        if r.num_computed_tokens % self.block_size == 0:
            self._full[rid] = None
        else:
            self._full.pop(rid, None)
        if rid not in self._ids:
            self._ids[rid] = 1
            self.facts = self._order = None
            self._batch_is_facts = False

    def discard(self, rid: int) -> None:
        """The request no longer decodes (its KV released, or a step left it in prefill)."""
        self._full.pop(rid, None)
        if self._ids.pop(rid, None) is not None:
            self.facts = self._order = None
            self._batch_is_facts = False
            self._removed += 1
            if 2 * self._removed > len(self._ids):
                self._compact()

    def _compact(self) -> None:
        """`_ids` rewritten in place without the slots of removed entries (a dict keeps them until
        it grows): a dict with more than a third of its slots removed copies entry by entry, one
        without them as a block, and the plan of the facts is a copy of it each time they change
        (`decode_tokens` copies that one every step)."""
        ids = self._ids.copy()
        self._ids.clear()
        self._ids.update(ids)
        self._removed = 0

    def split(self, plan) -> tuple:
        """(running decodes, the other entries) of any other valid plan, each in plan order: the
        decodes go on the decode batch, the others one by one; with preemptions or rejections every
        entry goes one by one."""
        sched, ids = plan.num_scheduled_tokens, self._ids
        if plan.preempt or plan.reject:
            return [], sched
        decodes = [rid for rid in sched if rid in ids]
        if not decodes or len(decodes) == len(sched):
            return decodes, {} if decodes else sched
        return decodes, {rid: n for rid, n in sched.items() if rid not in ids}

    def forget_batch(self) -> None:
        """Its members change outside `commit` (a preemption, or one of them committed one by one)."""
        self._batch.clear()
        self._batch_is_facts = False

    def commit(self, decodes: list, kv, steady: bool = False, alone: bool = True):
        """The batch of these running decodes (in this order) on the cached batch, each given its
        token's KV: a new block for those whose last block is full. `steady`: they are the view's
        decodes (every decoding request, in running order). Not `alone` (other entries follow):
        the cached batch itself, which `batch.joined` reads as a `Batch`."""
        if not (steady and self._batch_is_facts):
            self._batch.become(decodes)
            self._batch_is_facts = steady and self.facts is not None   # (not when running just changed)
        full = self._full
        growing = list(full) if len(decodes) == len(self._ids) else full.keys() & set(decodes)
        if growing:                           # their blocks in one take, in this order
            kv.grow_each(list(map(_table, map(self._requests.__getitem__, growing))))
            if len(growing) == len(full):
                full.clear()                  # their last blocks are no longer full
            else:
                for rid in growing:
                    del full[rid]
        return self._batch.batch() if alone else self._batch

    def postprocess(self, sampled: list, now: float, eos) -> list:
        """The cached batch's members take their tokens; returns those that finished (they left it)."""
        batch = self._batch
        finished = batch.advance(sampled, now, eos)
        self._full.update(dict.fromkeys(batch.full_last_block()))     # (in batch order, at C level)
        if finished:
            batch.leave(finished)
            self._batch_is_facts = False
        return finished


def positional_tokens(dataplane, cfg):
    """The plane's `tokens(start, stop)` where a decode's token is a function of its position
    (`Capability.POSITIONAL_TOKENS`) and no EOS can end a decode early (a finish must be known
    ahead for its tokens to be deferred); else None: every step writes every member's token."""
    if Capability.POSITIONAL_TOKENS in dataplane.capabilities and \
            (not cfg.stop_at_eos or dataplane.eos_token_id is None):
        return dataplane.tokens
    return None
