"""The persistent decode batch: a replay's steady state, kept from one step to the next.

Most steps of a replay decode the same running requests as the step before (vLLM v1
keeps its `InputBatch` on the runner for the same reason). While that ordered set stays
the same, the per-request lists handed to the data plane are reused and a step's
bookkeeping (one token, one timestamp, one computed token per request) is one tight pass
with no per-request checks. Finishes and full blocks are known ahead: each step adds
exactly one token to every member, so the step on which a member reaches its output
length, and the steps on which its last block fills, follow from its counts when it joins.
Members join at the end (a prefill just completed) and leave (finished) without the batch
being rebuilt; lists are replaced, never changed in place, so a batch already sent stays
as it ran.

On a plane whose sampled id depends on the position only (`Capability.POSITIONAL_TOKENS`, the
sim) and with no EOS to watch, a step writes nothing per member: the step's time goes on one
batch-level log, and a member's tokens since it last settled are a slice of the plane's id
table, its times a slice of that log and its computed count grows by their number (every
member takes one token a step). Only the next context lengths are built, at C level: each
context's successor looked up in a table of ints (`_successors`), so a step makes and frees no
int object per member (adding one to each did, which cost most of this pass). A member
is settled when it leaves, when the batch is cleared, and whenever anyone reads its lists.
While on the batch a member's class is `DeferredRequest`, whose `output_ids` and `token_times`
settle when read and whose `num_computed_tokens` and `num_tokens` count the steps pending; every
other request keeps `Request`'s plain slots, so the many reads of requests that are not
members (prefills, waiting ones) cost no more than before.
"""
from __future__ import annotations

from operator import attrgetter, itemgetter

from policylab.core.batch import Batch
from policylab.core.request import Request

_slot = Request.__dict__               # the slots' own descriptors, beneath DeferredRequest's properties
_get_out, _set_out = _slot["output_ids"].__get__, _slot["output_ids"].__set__
_get_times, _set_times = _slot["token_times"].__get__, _slot["token_times"].__set__
_computed, _set_computed = _slot["num_computed_tokens"].__get__, _slot["num_computed_tokens"].__set__
_table, _sampling, _context = attrgetter("block_table"), attrgetter("sampling"), attrgetter("num_computed_tokens")
# _NEXT[c] is c + 1: one int object per position up to the longest context seen (about 36 bytes
# each), shared by every engine in the process (a cluster's replicas hold one table, not one each)
_NEXT: list = [1]


def _successors(context: list) -> list:
    """[c + 1 for c in context] (contexts >= 0) as one C-level gather from `_NEXT`, grown to cover
    them (doubling): no int made or freed per member."""
    if len(context) < 2:                 # (itemgetter of one index returns the item, not a tuple)
        return [c + 1 for c in context]
    try:
        return list(itemgetter(*context)(_NEXT))
    except IndexError:
        _NEXT.extend(range(len(_NEXT) + 1, max(2 * len(_NEXT), max(context) + 1) + 1))
        return list(itemgetter(*context)(_NEXT))


def _settled(get, put, name: str) -> property:
    """A member's list slot `name` as a property: a read or a write finds its tokens settled."""
    def read(r):
        r.deferred.settle()
        return get(r)

    def write(r, value) -> None:
        r.deferred.settle()
        put(r, value)
    return property(read, write, doc=f"The request's {name}, its deferred tokens settled first.")


def _read_computed(r) -> int:
    """A member's computed count: as of its last settle, plus one for each step since."""
    deferred = r.deferred
    return _computed(r) + deferred.batch._steps - deferred.since


def _write_computed(r, value: int) -> None:
    r.deferred.settle()
    _set_computed(r, value)


class DeferredRequest(Request):
    """A member of a decode batch that defers its tokens (its class while on the batch): reads
    see every token it has taken, written or not."""

    __slots__ = ()
    output_ids = _settled(_get_out, _set_out, "output_ids")
    token_times = _settled(_get_times, _set_times, "token_times")
    num_computed_tokens = property(_read_computed, _write_computed, doc="Tokens whose KV is in the cache.")

    @property
    def num_tokens(self) -> int:
        """Known tokens (the deferred ones counted, not settled)."""
        return self.prompt_len + len(_get_out(self)) + self.deferred.pending


class Deferred:
    """One member's tokens, times and computed count not yet written: those of the batch's steps
    after `since`, sampled at positions `pos + step` (its context at a step is `pos` + the step)."""

    __slots__ = ("batch", "r", "out", "times", "since", "pos")

    def __init__(self, batch: "DecodeBatch", r, context: int):
        self.batch, self.r, self.out, self.times = batch, r, _get_out(r), _get_times(r)
        self.since, self.pos = batch._steps, context - batch._steps
        r.deferred = self
        r.__class__ = DeferredRequest

    @property
    def pending(self) -> int:
        """Tokens deferred: the batch's steps since the last settle."""
        return self.batch._steps - self.since

    def release(self) -> None:
        """Settle, and leave the request writing its own lists (unless another batch took it since:
        a request that moves to another engine joins that engine's batch)."""
        self.settle()
        if self.r.deferred is self:
            self.r.deferred = None
            self.r.__class__ = Request

    def settle(self) -> None:
        """Write the tokens, times and computed count of the steps since the last settle."""
        batch, since = self.batch, self.since
        steps = batch._steps
        if since != steps:
            self.out.extend(batch._tokens(self.pos + since, self.pos + steps))
            self.times.extend(batch._log[since:steps])
            _set_computed(self.r, _computed(self.r) + steps - since)
            self.since = steps


class DecodeBatch:
    """Running decodes in batch order: a private cache of `Decoding` (which requests decode and
    whose last block is full), valid while only its decodes change its members. Its lists carry a
    `Batch`'s names, so a step with other entries joins them to it (`batch.joined`) with no batch
    of the decodes alone made first."""

    def __init__(self, requests: list, target_len: dict, block_size: int, tokens=None):
        """`tokens(start, stop)`: the ids the plane samples after positions start..stop-1, when they
        depend on the position only and no EOS can stop a member (None: every step writes them)."""
        self._all, self._target_len, self.block_size = requests, target_len, block_size
        self._tokens = tokens
        self._deferred: dict = {}                 # member req_id -> its Deferred (with `tokens` only)
        self.clear()

    def clear(self) -> None:
        """Start over, empty (with new lists: batches already sent keep theirs)."""
        self._settle_all()
        self._log: list = []                      # the time of each step since the batch formed
        self.req_ids: list = []
        self.requests: list = []
        self._outputs, self._times, self._targets, self.context_lens = [], [], [], []
        self._members: dict = {}                  # member req_id -> None: the members as a set
        self.block_tables, self.sampling, self.token_ids = [], [], []
        self._steps = 0                           # steps decoded since the batch formed
        self._by_phase: dict = {}                 # (computed - steps) % block_size -> member ids
        self._finish_at: dict = {}                # step -> members that reach their output length on it
        self._due: dict = {}                      # member req_id -> that step
        self._members_changed()

    def become(self, ids: list) -> None:
        """Make `ids` the members, in order: kept when `ids` only extends them, else rebuilt."""
        have = len(self.req_ids)
        if len(ids) == have and ids == self.req_ids:      # the steady state: the same members
            return
        if ids[:have] != self.req_ids:
            self.clear()
            have = 0
        if len(ids) > have:
            self.join(ids[have:])

    def join(self, ids: list) -> None:
        """Add running decodes at the end of the batch."""
        rs = list(map(self._all.__getitem__, ids))
        context = list(map(_context, rs))
        target_len = self._target_len
        self.req_ids, self.requests = self.req_ids + ids, self.requests + rs
        if self._tokens is None:                  # (what a step writes to, and checks EOS against)
            self._outputs = self._outputs + [r.output_ids for r in rs]
            self._times = self._times + [r.token_times for r in rs]
            self._targets = self._targets + [target_len[rid] for rid in ids]
        self.context_lens = self.context_lens + context
        self.block_tables = self.block_tables + list(map(_table, rs))
        self.sampling = self.sampling + list(map(_sampling, rs))
        self._members_changed()
        steps, due, bs, by_phase, finish_at = self._steps, self._due, self.block_size, self._by_phase, self._finish_at
        members, deferred = self._members, self._deferred if self._tokens is not None else None
        for r, rid, c in zip(rs, ids, context):
            members[rid] = None
            by_phase.setdefault((c - steps) % bs, []).append(rid)
            left = target_len[rid] - len(r.output_ids)                      # (one token a step)
            due[rid] = step = steps + (left if left > 1 else 1)
            finish_at.setdefault(step, []).append(r)
            if deferred is not None:
                deferred[rid] = Deferred(self, r, c)

    def has_any(self, ids) -> bool:
        """Some of `ids` (a dict or set) are members (the smaller side is the one looked through)."""
        return not self._members.keys().isdisjoint(ids.keys() if isinstance(ids, dict) else ids)

    def leave(self, finished: list) -> None:
        """Drop finished members."""
        at = sorted(map(self.requests.index, finished), reverse=True)     # (a few, out of many)
        eager = self._tokens is None
        kept = [members.copy() for members in (self.req_ids, self.requests, self.context_lens, self.block_tables,
                self.sampling, *((self._outputs, self._times, self._targets) if eager else ()))]
        for members in kept:                          # (new lists: batches already sent keep theirs)
            for i in at:
                del members[i]
        self.req_ids, self.requests, self.context_lens, self.block_tables, self.sampling = kept[:5]
        if eager:
            self._outputs, self._times, self._targets = kept[5:]
        self._members_changed()
        deferred = self._deferred
        for r in finished:
            if deferred:
                deferred.pop(r.req_id).release()
            del self._members[r.req_id]
            early = self._finish_at.get(self._due.pop(r.req_id))      # (stopped at EOS before it)
            if early:
                early.remove(r)
            # (in place: `full_last_block`'s lists are read at once, never kept)
            self._by_phase[(r.num_computed_tokens - self._steps) % self.block_size].remove(r.req_id)

    def _members_changed(self) -> None:
        """Per-member constants: one token each, every one sampled."""
        self.decodes = n = len(self.req_ids)
        self.query_lens, self.sample = [1] * n, [True] * n

    def batch(self) -> Batch:
        return Batch(self.req_ids, self.query_lens, self.context_lens, self.block_tables, [], self.sample, self.sampling,
                     decodes=self.decodes)

    def _settle_all(self) -> None:
        """Write every member's deferred tokens, times and count; none is deferred any more."""
        if self._deferred:
            for d in self._deferred.values():
                d.release()
            self._deferred = {}

    def advance(self, sampled: list, now: float, eos) -> list:
        """Apply one step's tokens (`sampled`: the members' first, in batch order; any after them
        are not theirs); returns the members that finished (they must `leave`)."""
        if self._tokens is not None:          # tokens, times and counts deferred: one log entry
            self._steps = steps = self._steps + 1
            self._log.append(now)
            self.context_lens = _successors(self.context_lens)    # (a fresh list; one token each)
            return self._finish_at.pop(steps, [])
        self._steps += 1
        self.context_lens = context = []          # a fresh list: batches stay as sent
        for r, out, times, token in zip(self.requests, self._outputs, self._times, sampled):
            out.append(token)
            times.append(now)
            r.num_computed_tokens = c = r.num_computed_tokens + 1
            context.append(c)                 # (a method call the interpreter inlines; a bound one it does not)
        if eos is not None and eos in sampled[:len(context)]:     # any member may stop at EOS
            return [r for r, out, target in zip(self.requests, self._outputs, self._targets)
                    if len(out) >= target or out[-1] == eos]
        return self._finish_at.pop(self._steps, [])    # (in batch order: members join at the end)

    def full_last_block(self) -> list:
        """Members whose last KV block is full now: their next token takes a new block."""
        return self._by_phase.get(-self._steps % self.block_size, ())
