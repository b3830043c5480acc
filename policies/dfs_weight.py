"""dfs_weight — SGLang's DFS-weight order over the prefix tree, with a bound on waiting.

Rule: the waiting requests' prefix-cache matches form a tree (a node is a cached block; a
request sits at the deepest block it would reuse, `RequestView.cached_blocks()`, or at the
root if it reuses none). A node's weight is the number of waiting requests at it or below it.
Requests are admitted in the order of a depth-first walk from the root that enters heavier
children first and lists a node's own requests after all of its children's. Requests that
extend the same cached branch thus start one after another, and the branch most of the queue
wants is served while it is cached; requests with no hits come last. Ties: a child whose
subtree holds the earliest queue position goes first; a node's own requests keep queue order.
Batching is `chunked`'s (decodes first in one `chunk_size` budget, head-of-line admission,
tail preemption, recompute or swap: `preempt_mode`).

Starvation: the walk puts requests with no hits behind every request that hits, for as long
as such requests keep arriving. `max_wait_s` bounds it (null: off): a request that has waited
longer than max_wait_s since it arrived is overdue, and overdue requests go first, FCFS. An
overdue request is passed only by requests that arrived before it (harness property `max_wait`).

Either prefix index gives the same order: a block's chained hash fingerprints everything
before it, so a cached block has one parent, and the waiting requests' matched blocks form
the same tree under `engine.prefix_cache=hash` as under `radix` (the walk needs only the
branches that lead to waiting requests, which both indexes answer alike). With prefix caching
off nothing matches, every request sits at the root, and the order is FCFS (`chunked`).
Cost: a sort of the waiting requests' matches per step (tuple comparisons) and one pass over
the branch points; SGLang recomputes the order every step too.
Sources: Zheng et al., "SGLang: Efficient Execution of Structured Language Model Programs",
NeurIPS'24 §3 and App. (cache-aware scheduling, DFS order with subtree weights); SGLang
`schedule_policy.py` (`dfs-weight`).
"""
from __future__ import annotations

from policylab import SchedulerView
from policies.chunked import Chunked
from policies.lpm import checked_max_wait, split_overdue


def common_prefix(a: tuple, b: tuple) -> int:
    """Length of the longest common prefix of two tuples (binary search on slice comparisons)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 1:                    # invariant: a[:lo] == b[:lo], a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def dfs_weight_order(paths: list) -> list:
    """Indices of `paths` (each a request's matched blocks from the root; index = queue position)
    in DFS-weight order: heavier subtrees first, a node's own requests after its children's.

    Sorted, the paths of one subtree are contiguous and the subtree's node is their common
    prefix, so the walk visits only branch points (at most 2n nodes), not every block."""
    order = sorted(range(len(paths)), key=paths.__getitem__)      # stable: equal paths keep queue order
    out: list = []
    stack: list = [(0, len(order), 0)]    # (lo, hi, depth): the node at `depth` that order[lo:hi] pass
    while stack:
        frame = stack.pop()
        if isinstance(frame, list):       # a node's own requests, after its children's
            out.extend(frame)
            continue
        lo, hi, depth = frame
        k = lo
        while k < hi and len(paths[order[k]]) == depth:
            k += 1
        own, children = order[lo:k], []
        while k < hi:                     # runs of equal next block: one child each
            head, end = paths[order[k]][depth], k + 1
            while end < hi and paths[order[end]][depth] == head:
                end += 1
            children.append((-(end - k), min(order[k:end]), k, end))
            k = end
        stack.append(own)
        for _, _, start, end in sorted(children, reverse=True):       # pushed last-first: heaviest pops first
            stack.append((start, end, common_prefix(paths[order[start]], paths[order[end - 1]])))
    return out


class DfsWeight(Chunked):
    properties = ("stall_free", "chunk_budget", "max_wait")

    def __init__(self, name: str | None = None, chunk_size: int | None = 512, max_partial_prefills: int = 1,
                 max_wait_s: float | None = 30.0, preempt_mode: str = "recompute"):
        super().__init__(name or "dfs_weight", chunk_size, max_partial_prefills, preempt_mode)
        self.max_wait_s = checked_max_wait(self.name, max_wait_s)

    def admission_order(self, view: SchedulerView):
        overdue, rest = split_overdue(view, self.max_wait_s)
        paths = [v.cached_blocks() for v in rest]
        return overdue + [rest[i] for i in dfs_weight_order(paths)]
