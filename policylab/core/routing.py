"""The routing contract: a router sees a read-only cluster view and returns a replica id.

It sits in the core beside the step contract, so router plugins (policies/routers/) import it
through the front door (`from policylab import Router, ...`) as policies do; the cluster loop
that applies it is `policylab.cluster`.

The same discipline as the step contract (DESIGN §3): the view is read-only, the driver
validates every choice with `validate_route`, and a broken rule raises `RouteViolation` (a
`ContractViolation`) naming the router and the rule. A request that no replica could ever hold
is rejected with a reason by the driver before any router is asked.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np

from policylab.core import admission
from policylab.core.contract import ContractViolation, hide_slot
from policylab.core.kv import chain_hashes
from policylab.core.synthetic_prompts import synthesize_prompt

if TYPE_CHECKING:
    from policylab.core.engine import Engine


class RouteViolation(ContractViolation):
    """A router broke the routing contract: a ContractViolation whose message names a router."""

    def __init__(self, router: str, rule: str, detail: str):
        super().__init__(router, rule, detail)
        self.args = (f"router '{router}' broke rule '{rule}': {detail}",)

    def __str__(self) -> str:
        return self.args[0]


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What a router may know of the request it places (never its true output length)."""
    req_id: int
    arrival_time: float
    prompt_tokens: int
    max_tokens: Optional[int]        # the trace's declared cap, if any
    client: str
    priority: int
    ttft_slo: Optional[float]
    tpot_slo: Optional[float]
    prefix_hashes: tuple             # the trace's shared-prefix block ids
    prefilled: bool = False          # P/D: its prompt is computed, its KV moves to the chosen replica


@dataclass(frozen=True, slots=True)
class RunningRequest:
    """What a rebalancing router may know of a request running on a replica."""
    req_id: int
    priority: int
    num_tokens: int                  # prompt + output so far
    num_blocks: int                  # KV blocks it holds on this replica
    decoding: bool                   # its prompt is computed: it decodes (only these can migrate)


@dataclass(frozen=True, slots=True)
class Migration:
    """A rebalancing router's decision: move running request `req_id`'s KV from replica `source`
    to replica `destination`, live (policylab.cluster.migration)."""
    req_id: int
    source: int
    destination: int


class ReplicaView:
    """Read-only window on one replica. Load figures are computed when read (a router that does
    not read them costs nothing), from the engine's live requests; the engine itself sits in a
    hidden slot no attribute reaches."""

    __slots__ = ("index", "role", "hardware", "_engine", "_prompt_hashes")

    def __init__(self, index: int, role: str, hardware: str, engine: "Engine",
                 prompt_hashes: Callable[[int, int], list]):
        self.index, self.role, self.hardware = index, role, hardware
        _set_engine(self, engine)
        _set_prompt_hashes(self, prompt_hashes)

    num_waiting = property(lambda s: _engine_of(s).ops.num_waiting)
    num_running = property(lambda s: len(_engine_of(s).running))
    num_free_blocks = property(lambda s: _engine_of(s).kv.num_free)
    num_total_blocks = property(lambda s: _engine_of(s).kv.num_blocks)
    block_size = property(lambda s: _engine_of(s).kv.block_size)
    max_model_len = property(lambda s: _engine_of(s).cfg.max_model_len)

    @property
    def outstanding_prefill_tokens(self) -> int:
        """Prompt tokens (and recomputes) not yet in this replica's KV cache."""
        return self._outstanding()[0]

    @property
    def outstanding_decode_tokens(self) -> int:
        """Output tokens still owed as far as a scheduler can know: the predicted remainder where
        `engine.predictor` gives one, else 1 per live request (it owes at least one more)."""
        return self._outstanding()[1]

    @property
    def outstanding_tokens(self) -> int:
        """Vidur's least-outstanding-requests load, in tokens: prefill plus decode work left."""
        prefill, decode = self._outstanding()
        return prefill + decode

    def _outstanding(self) -> tuple:
        """(prefill, decode) tokens outstanding, in one pass over the waiting and running requests
        (the queue's ids through the engine's ops, not `engine.waiting`'s list of requests)."""
        e = _engine_of(self)
        prefill = decode = 0
        for r in chain(map(e.requests.__getitem__, e.ops.waiting_ids()), e.running):
            prompt, computed = len(r.prompt_ids), r.num_computed_tokens
            if computed < prompt:
                prefill += prompt - computed
            owed = (r.predicted_output_tokens or 0) - len(r.output_ids)
            decode += owed if owed > 1 else 1
        return prefill, decode

    @property
    def running_requests(self) -> tuple:
        """The requests running here now (RunningRequest each, in running order): what a
        rebalancing router chooses a request to migrate from."""
        e = _engine_of(self)
        return tuple(RunningRequest(r.req_id, r.priority, r.num_tokens, len(r.block_table),
                                    r.num_computed_tokens >= len(r.prompt_ids)) for r in e.running)

    def cached_prefix_tokens(self, request: RouteRequest) -> int:
        """Prompt tokens this request would find in this replica's prefix cache now (a lookup:
        no reference taken, no LRU order changed)."""
        kv = _engine_of(self).kv
        hashes = _prompt_hashes_of(self)(request.req_id, kv.block_size)
        return len(kv.lookup(hashes, (request.prompt_tokens - 1) // kv.block_size)) * kv.block_size

    def never_fits(self, request: RouteRequest, output_tokens: int) -> str:
        """Why this replica can never run the request ("" if it can); `output_tokens` as the driver knows it."""
        e = _engine_of(self)
        return admission.never_fits(request.prompt_tokens, output_tokens, e.cfg.max_model_len,
                                    e.kv.num_blocks, e.kv.block_size, request.max_tokens or e.cfg.max_tokens)

    def __repr__(self) -> str:
        return f"ReplicaView({self.index}, {self.role}, {self.hardware}, waiting={self.num_waiting}, " \
               f"running={self.num_running}, free_blocks={self.num_free_blocks})"


(_engine_of, _set_engine), (_prompt_hashes_of, _set_prompt_hashes) = \
    hide_slot(ReplicaView, "_engine"), hide_slot(ReplicaView, "_prompt_hashes")   # no router reaches them


class CapacityView:
    """What a router that reads no load (`Router.reads_load = False`) sees of a replica: who it is
    and how big, never how busy. Reading anything else (waiting counts, outstanding tokens, cached
    prefixes) breaks rule `reads_load`: the cluster replays such a router's replicas one after the
    other, so their load at an arrival is not there to read."""

    __slots__ = ("index", "role", "hardware", "num_total_blocks", "block_size", "max_model_len", "_replica",
                 "_router")

    def __init__(self, replica: ReplicaView, router: str):
        self.index, self.role, self.hardware = replica.index, replica.role, replica.hardware
        self.num_total_blocks, self.block_size = replica.num_total_blocks, replica.block_size
        self.max_model_len, self._router = replica.max_model_len, router
        _set_replica(self, replica)

    def never_fits(self, request: RouteRequest, output_tokens: int) -> str:
        return _replica_of(self).never_fits(request, output_tokens)

    def __getattr__(self, name: str):       # (only called for what the slots above do not hold)
        if not hasattr(ReplicaView, name):  # (a name no replica view has: the usual AttributeError,
            raise AttributeError(name)      # which hasattr() and copy rely on)
        raise RouteViolation(self._router, "reads_load", f"the router declares reads_load = False but read "
                             f"replica {self.index}'s {name!r}: a router that weighs load must not declare it")

    def __repr__(self) -> str:
        return f"CapacityView({self.index}, {self.role}, {self.hardware}, blocks={self.num_total_blocks})"


_replica_of, _set_replica = hide_slot(CapacityView, "_replica")


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The replicas a router may choose from now (all of them, or one pool of a P/D cluster)."""
    clock: float
    replicas: tuple                  # ReplicaView, by replica index
    migrating: frozenset = frozenset()   # req_ids whose migration is under way (a rebalancer's view)

    def least_loaded(self, among=None) -> "ReplicaView":
        """The replica with the fewest outstanding tokens (lowest index on a tie)."""
        return min(among or self.replicas, key=lambda r: (r.outstanding_tokens, r.index))


class Router:
    """Base class of router plugins (`router=NAME`, `policies/routers/NAME.py`): `route` returns
    the index of one of `view.replicas`.

    A router whose choices depend only on the request, on which replicas can hold it and on its
    own state (round robin, a seeded draw) sets `reads_load = False`: the replicas are then
    independent, and the cluster replays them one after the other through each stretch of
    arrivals instead of step by step (same results, faster). Its view then holds `CapacityView`s."""

    reads_load: bool = True

    def __init__(self, name: Optional[str] = None, seed: int = 0):
        self.name = name or type(self).__name__
        self.seed = seed

    def route(self, request: RouteRequest, view: ClusterView) -> int:
        raise NotImplementedError

    def rebalance(self, view: ClusterView) -> list:
        """Running requests to move between replicas now (`Migration`s; none by default)."""
        return []


def validate_route(replicas: list, eligible: tuple, request: RouteRequest, choice, router: str,
                   output_tokens: int) -> None:
    """Refuse a choice that is not a replica of the cluster's pool, or one that can never hold the
    request (`eligible`: the view's replicas, those that can)."""
    if type(choice) is not int:
        raise RouteViolation(router, "route_type", f"route() must return a replica index (int), got {choice!r}")
    if any(v.index == choice for v in eligible):
        return
    chosen = next((v for v in replicas if v.index == choice), None)
    why = chosen.never_fits(request, output_tokens) if chosen is not None else ""
    if why:
        raise RouteViolation(router, "never_fits", f"request {request.req_id} routed to replica {choice}, "
                                f"which can never hold it: {why}")
    raise RouteViolation(router, "unknown_replica", f"request {request.req_id} routed to replica {choice}; "
                            f"the candidates are {[v.index for v in eligible]}")


def prompt_hash_cache(engines: list, compute: Callable[[int, int], list]) -> Callable[[int, int], list]:
    """Memoized `compute(req_id, block_size)`: a request's prompt block keys as its engine makes
    them on arrival (computed once per request, only when a router asks about cached prefixes)."""
    memo: dict = {}

    def hashes(req_id: int, block_size: int) -> list:
        key = (req_id, block_size)
        if key not in memo:
            if len(memo) > 4 * max(len(engines), 1):   # only the request being routed is asked about
                memo.clear()
            memo[key] = compute(req_id, block_size)
        return memo[key]
    return hashes


def prompt_block_keys(trace: list, engine, i: int, block_size: int) -> list:
    """Request i's prompt block keys as every replica's engine makes them (same seed everywhere):
    the chained hashes of its ids; none for a prompt of its own, whose blocks only it can ever
    hit, after a preemption, on a replica it ran on (`kv.own_block_keys`): never when routed."""
    t = trace[i]
    if t.own_prompt:
        return []
    if t.prompt_ids is not None:
        return chain_hashes(np.asarray(t.prompt_ids, dtype=np.int32), block_size)
    ids = synthesize_prompt(i, t.prompt_tokens, t.prefix_hashes, engine.dataplane.vocab_size, engine.seed,
                            engine.prefix_block_tokens)
    return chain_hashes(ids, block_size)
