"""Prompt blocks published when they are scheduled (`engine.publish_on_schedule`), as vLLM does.

vLLM's scheduler puts a prompt's full blocks in the prefix cache as soon as it schedules them
(`KVCacheManager.allocate_slots` caches up to the tokens just scheduled), so a request admitted
later in the same step already hits a prefix that is still being computed: a burst of requests
sharing a system prompt computes that prompt once, in the first step. The blocks are written in
the same forward pass before any attention reads them (every layer writes the whole batch's K/V,
then attends), so the hit is sound.

Without the setting, a block enters the cache once its step has computed it, and requests
admitted in that same step compute the shared prefix again.

A hit on such a block costs no free block (the request computing it holds it), and the hits are
block-aligned, so a plan needs exactly the free blocks it needs without them: only which prompt
positions a starting request computes changes. A request takes as many of these blocks as the
tokens the plan gives it leave room for (its planned tokens still end at or before its last
known token).
"""
from __future__ import annotations


def same_step_hits(entries, hits, block_size: int) -> dict:
    """For each request starting in `entries` ((request, tokens) pairs in plan order), the hashes
    of the prompt blocks after its cache hits `hits(request)` that earlier entries compute this
    step: {req_id: hashes}, only for those that take some. A request holding KV (or resuming it)
    publishes the blocks its tokens complete and looks nothing up."""
    planned: set = set()
    taken: dict = {}
    for r, n in entries:
        hashes = r.block_hashes
        if r.block_table or r.num_computed_tokens or r.swapped_blocks:     # holds or resumes KV
            start = r.num_computed_tokens
        else:
            base = hits(r)
            start = len(base) * block_size
            if planned and (not base or type(base[-1]) is int):     # (not after a lower tier's hit)
                room = min((r.num_tokens - n) // block_size, len(hashes))
                k = len(base)
                while k < room and hashes[k] in planned:
                    k += 1
                if k > len(base):
                    taken[r.req_id] = hashes[len(base):k]
                    start = k * block_size
        first, end = start // block_size, min((start + n) // block_size, len(hashes))
        if end > first:
            planned.update(hashes[first:end])
    return taken
