"""Prefill/decode disaggregation (DistServe, Splitwise, Mooncake): a request is prefilled on a
prefill replica, its KV blocks move over a link to a decode replica, and it decodes there.

- The prefill replicas' engines are built on the trace with one output token per request, so a
  request finishes there when its prompt is computed and its first token exists. **TTFT is
  counted then**, at the end of prefill, as DistServe and vLLM's disaggregated prefill do: the
  token exists and could be streamed; the transfer delays the second token (it is in TPOT).
- At that moment the decode router (a plugin, `decode_router=`) picks a decode replica, which
  takes the request's prompt blocks from its own cache (FIFO per replica). If they do not fit,
  the request waits until a step of that replica frees enough: that wait is `kv_wait`. It also
  waits while the replica's running requests and the handoffs already holding its blocks fill
  `max_num_seqs`: blocks held by requests that cannot run would leave the running ones no room
  to grow and nothing a policy could preempt to free some (vLLM's decode side likewise takes a
  remote prefill's blocks only when it can schedule the request).
- The transfer then takes `transfer_time` (the link model, from the prompt's KV bytes); after
  it the request joins the decode replica's waiting queue with its prompt already computed,
  one token to decode next. Both times are per-request columns of requests.parquet.
- The prefill replica frees the request's blocks when it finishes there, so the request is on
  one replica at a time; the handoff is ordered (prefill end ≤ decode arrival).
- On a data plane that holds KV contents (`dataplane=torch`: `export_kv`/`import_kv`) the K/V
  really moves: copied out of the prefill replica's blocks when the request finishes there
  (before they can be reused) and written into the decode replica's blocks when the transfer
  ends, so the decode replica attends to the prompt the prefill replica computed. The transfer's
  duration stays the link model's (the copy is a memory copy in one process, not a network).
"""
from __future__ import annotations

from collections import deque
from dataclasses import replace

import numpy as np

from policylab.cluster.link import LinkModel
from policylab.core.extension import Extension
from policylab.core.routing import RouteRequest, Router
from policylab.core.admission import predict_output
from policylab.core.kv import blocks_for
from policylab.core.request import Request, Status


def front_of(t):
    """A request as a prefill replica serves it: it ends after its first token."""
    return replace(t, output_tokens=min(t.output_tokens, 1))


def prefill_trace(trace: list) -> list:
    """The trace a prefill replica's engine is built on: every request ends after one token."""
    return [front_of(t) for t in trace]


class Disaggregation:
    def __init__(self, router: Router, link: LinkModel, kv_bytes_per_token: float, seed: int = 0):
        self.router, self.link, self.kv_bytes_per_token = router, link, kv_bytes_per_token
        self._rng = np.random.default_rng(seed)        # decode-side output predictions
        self.cluster = None

    def attach(self, cluster) -> None:
        self.cluster = cluster
        self.payloads: dict = {}          # req_id -> its prompt's K/V, from a plane that holds KV
        for replica in cluster.replicas:
            replica.engine.extend(PrefillHandoff(self) if replica.role == "prefill" else DecodeHandoff())
        self.pool = [v for v in cluster.views if v.role == "decode"]
        self.pending = {v.index: deque() for v in self.pool}     # decode replica -> (req_id, since)
        self.holding = {v.index: set() for v in self.pool}       # handoffs with its blocks, not run there yet
        self.in_transit: set = set()      # finished on a prefill replica, not yet on a decode one

    def front_output_tokens(self, i: int) -> int:
        return min(self.cluster.trace[i].output_tokens, 1)

    def never_fits_decode(self, request: RouteRequest) -> str:
        """Why no decode replica could ever hold the whole request ("" if one can)."""
        out = self.cluster.trace[request.req_id].output_tokens
        whys = [v.never_fits(request, out) for v in self.pool]
        return "" if not all(whys) else f"no decode replica can ever hold it ({whys[0]})"

    def _continues(self, r: Request) -> bool:
        """A request finished on a prefill replica still has tokens to decode."""
        return r.status is Status.FINISHED and \
            min(self.cluster.trace[r.req_id].output_tokens, r.max_tokens) > len(r.output_ids)

    def export(self, kv, r: Request) -> None:
        """A request finishing its prefill here: its prompt's K/V, copied before its blocks are freed."""
        if self._continues(r):
            payload = kv.export(r.block_table)
            if payload is not None:
                self.payloads[r.req_id] = payload

    def hand_off(self, replica, req_id: int) -> bool:
        """A prefill replica finished `req_id`: schedule its move to decode (False: it is done)."""
        if not self._continues(replica.engine.requests[req_id]):
            return False
        self.in_transit.add(req_id)
        self.cluster.push(replica.engine.clock.now, self._route, req_id)
        return True

    def _route(self, req_id: int, now: float) -> None:
        cluster = self.cluster
        request = cluster.route_request(req_id, prefilled=True)
        choice, why = cluster.choose(self.router, self.pool, request, cluster.trace[req_id].output_tokens, now)
        if choice is None:        # never_fits_decode() let it in, so this cannot happen
            raise RuntimeError(f"request {req_id}: {why}")
        cluster.placement["decode_replica"][req_id] = choice
        self.pending[choice].append((req_id, now))
        self._take_blocks(choice, now)

    def after_step(self, replica) -> None:
        if replica.role == "decode" and self.pending[replica.index]:
            self._take_blocks(replica.index, replica.engine.clock.now)

    def _take_blocks(self, index: int, now: float) -> None:
        """Start the transfers of this decode replica's waiting handoffs, in order, while their
        prompt blocks fit in its free KV blocks."""
        cluster, queue = self.cluster, self.pending[index]
        engine = cluster.replicas[index].engine
        kv = engine.kv
        while queue:
            req_id, since = queue[0]
            prompt = cluster.trace[req_id].prompt_tokens
            if blocks_for(prompt, kv.block_size) > kv.num_free or \
                    len(engine.running) + self._holding(index) >= engine.cfg.max_num_seqs:
                return
            queue.popleft()
            self.holding[index].add(req_id)
            table = kv.receive(prompt)
            transfer = self.link.transfer_time(prompt * self.kv_bytes_per_token)
            cluster.placement["kv_wait"][req_id] = now - since
            cluster.placement["transfer_time"][req_id] = transfer
            cluster.push(now + transfer, self._arrive, (req_id, index, table))

    def _holding(self, index: int) -> int:
        """Handoffs holding blocks of decode replica `index` that have not run there yet."""
        held, requests = self.holding[index], self.cluster.replicas[index].engine.requests
        for req_id in [i for i in held if i not in self.in_transit]:
            r = requests[req_id]
            if r is None or r.status is not Status.WAITING or not r.block_table:
                held.discard(req_id)
        return len(held)

    def _arrive(self, arg: tuple, now: float) -> None:
        """The KV has arrived: the request joins the decode replica, its prompt computed."""
        req_id, index, table = arg
        cluster = self.cluster
        engine, p, t = cluster.replicas[index].engine, cluster.requests[req_id], cluster.trace[req_id]
        r = Request(req_id, p.arrival_time, p.prompt_ids, p.max_tokens, p.client, p.priority, p.ttft_slo,
                    p.tpot_slo, predict_output(engine.cfg, self._rng, t.output_tokens), p.sampling,
                    output_ids=list(p.output_ids), num_computed_tokens=len(p.prompt_ids), block_table=table,
                    block_hashes=list(p.block_hashes), own_prompt=p.own_prompt,
                    first_scheduled_time=p.first_scheduled_time,
                    token_times=list(p.token_times), num_preemptions=p.num_preemptions,
                    num_cached_tokens_total=p.num_cached_tokens_total)
        engine.kv.received(table, self.payloads.pop(req_id, None), r.block_hashes, r.num_computed_tokens)
        engine.clock.idle_until(now)
        engine.receive_prefilled(r, min(t.output_tokens, r.max_tokens))
        cluster.refresh(index)
        cluster.requests[req_id] = r
        self.in_transit.discard(req_id)


class PrefillHandoff(Extension):
    """The P/D hand-off's side on a prefill replica: a request that finishes its prefill there
    leaves its prompt's K/V with the hand-off before its blocks are freed."""

    name = "pd_handoff"

    def __init__(self, disaggregation: Disaggregation):
        self.pd = disaggregation

    def on_finish(self, r: Request) -> None:
        self.pd.export(self.ops.kv, r)


class DecodeHandoff(Extension):
    """The P/D hand-off's side on a decode replica. Handed-off requests wait holding their prompt's
    blocks, so a policy can find every free block held by requests it would start later (a swapped
    request at the head of its queue, say, whose blocks do not fit): when its plan is then empty
    and nothing else can happen, the waiting hand-offs' KV goes to swap space where it has room,
    else it is freed (they recompute their prompt here), and the policy is asked again."""

    name = "pd_decode"

    def on_stuck(self) -> str:
        ops, freed = self.ops, False
        for rid in ops.waiting_ids():
            r = ops.request(rid)
            if r.block_table:
                fits = ops.kv.host_free >= -(-r.num_computed_tokens // ops.kv.block_size)
                computed = ops.evict(r, fits)
                if not fits:
                    ops.kv.stats["recomputed_tokens"] += computed
                freed = True
        return "retry" if freed else ""
