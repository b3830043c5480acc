"""Policy-specific properties (DESIGN §8) that a policy declares in `properties`.

A policy class lists the promises it makes, e.g. `properties = ("stall_free", "vtc")`;
the harness checks each one on every step besides the engine-wide invariants. Shipped
policies that cannot carry the attribute get it from `BUILTIN`.
"""
from __future__ import annotations

from collections import defaultdict
from itertools import combinations

EPS = 1e-9


class InvariantViolation(AssertionError):
    """An invariant broke; `invariant` names it, the message says where and how."""

    def __init__(self, invariant: str, detail: str, policy: str = ""):
        self.invariant, self.detail, self.policy = invariant, detail, policy
        super().__init__(f"[{invariant}] policy '{policy}': {detail}")


class Property:
    """Base: hooks called around every schedule() and after every step."""

    name = ""

    def __init__(self, policy, cfg, trace):
        self.policy, self.cfg, self.trace = policy, cfg, trace

    def fail(self, detail: str):
        raise InvariantViolation(self.name, detail, getattr(self.policy, "name", ""))

    def before_schedule(self, view) -> None: ...

    def after_schedule(self, view, plan) -> None: ...

    def after_step(self, engine) -> None: ...

    def at_end(self, engine, result) -> None: ...


class SinglePhase(Property):
    """prefill_first: a step is all prefill chunks or all decodes, never both (a running fork's
    first token, the one prompt token it computes on its shared prompt, counts as a decode)."""

    name = "single_phase"

    def after_schedule(self, view, plan):
        sched = plan.num_scheduled_tokens
        phases = {v.is_decode or v.fork_of is not None and v.status == "running" and not v.num_output_tokens
                  for v in (*view.running, *view.waiting) if v.req_id in sched}
        if len(phases) > 1:
            self.fail(f"step {view.step} mixes prefill chunks and decodes")


class StallFree(Property):
    """Every running, non-preempted decode gets its token every step (Sarathi-Serve)."""

    name = "stall_free"

    def after_schedule(self, view, plan):
        for v in view.running:
            if v.is_decode and v.req_id not in plan.num_scheduled_tokens and v.req_id not in plan.preempt:
                self.fail(f"step {view.step}: running decode {v.req_id} stalled")


class ChunkBudget(Property):
    """A step never holds more than the policy's own `chunk_size` tokens."""

    name = "chunk_budget"

    def after_schedule(self, view, plan):
        cap = getattr(self.policy, "chunk_size", None)
        if cap is not None and plan.total_tokens > cap:
            self.fail(f"step {view.step}: {plan.total_tokens} tokens > chunk_size={cap}")


class DrainedAdmission(Property):
    """Request-level batching: nothing new is admitted while a batch runs."""

    name = "drained_admission"

    def after_schedule(self, view, plan):
        if view.running and any(v.req_id in plan.num_scheduled_tokens for v in view.waiting):
            self.fail(f"step {view.step}: admitted a request while {len(view.running)} run")


class AgingBound(Property):
    """No starvation: x is never passed by a y that arrived more than
    (base_key(x) − base_key(y)) / aging_rate seconds after it (lower key = served first).
    The policy exposes `aging_rate` and `base_key(view)`."""

    name = "aging_bound"

    def after_schedule(self, view, plan):
        rate = self.policy.aging_rate
        if rate <= 0:
            return
        sched = plan.num_scheduled_tokens
        key = {v.req_id: self.policy.base_key(v) for v in view.waiting}
        admitted = [v for v in view.waiting if v.req_id in sched]
        passed = [v for v in view.waiting if v.req_id not in sched and v.req_id not in plan.reject]
        for y in admitted:
            for x in passed:
                lag = y.arrival_time - x.arrival_time
                if lag > 0 and rate * lag > key[x.req_id] - key[y.req_id] + EPS:
                    self.fail(f"step {view.step}: request {y.req_id} passed {x.req_id}, arriving {lag:.3g}s "
                              f"after it with base keys {key[y.req_id]:.3g} vs {key[x.req_id]:.3g}")


class MaxWait(Property):
    """No starvation past a deadline: a waiting request that has waited longer than the policy's
    `max_wait_s` since it arrived (overdue) is passed only by requests that arrived before it
    (arrival, then id): overdue requests are served first, FCFS. `max_wait_s=None` is no bound."""

    name = "max_wait"

    def after_schedule(self, view, plan):
        bound = self.policy.max_wait_s
        if bound is None:
            return
        sched, now = plan.num_scheduled_tokens, view.clock
        overdue = [v for v in view.waiting if now - v.arrival_time > bound and v.req_id not in plan.reject]
        passed = [x for x in overdue if x.req_id not in sched]
        if not passed:
            return
        first = min(passed, key=lambda x: (x.arrival_time, x.req_id))
        for y in view.waiting:
            if y.req_id in sched and (y.arrival_time, y.req_id) > (first.arrival_time, first.req_id):
                self.fail(f"step {view.step}: request {y.req_id} (arrived {y.arrival_time:.6g}s) started while "
                          f"{first.req_id} (arrived {first.arrival_time:.6g}s) had waited "
                          f"{now - first.arrival_time:.3g}s > max_wait_s={bound}")


class VtcFairness(Property):
    """VTC: counters never decrease; a client that becomes backlogged is lifted to at least
    the least counter of those that stayed backlogged; and between two continuously
    backlogged clients the weighted service difference (measured from the engine, not the
    policy) stays within 2·(w_in·L_input + w_out·M)/min weight + one step of tokens
    (Sheng et al. OSDI'24 Thm 4.3 with M = KV capacity in tokens). The policy exposes
    `counters`, `w_in`, `w_out` and `weight(client)`."""

    name = "vtc"

    def __init__(self, policy, cfg, trace):
        super().__init__(policy, cfg, trace)
        self.bound = None                 # needs the KV capacity: set at the first step
        self.service: dict = defaultdict(float)
        self.outputs: dict = {}           # req_id -> output tokens already counted
        self.backlog: set = set()
        self.ranges: dict = {}            # (f, g) -> [min, max] of service_f − service_g
        self.before: dict = {}
        self.lifted, self.stayed = set(), set()

    def before_schedule(self, view):
        if self.bound is None:
            p, capacity = self.policy, view.num_total_blocks * view.block_size
            longest = max(t.prompt_tokens for t in self.trace)
            weight = min(p.weight(c) for c in {t.client for t in self.trace})
            self.bound = 2 * (p.w_in * longest + p.w_out * (capacity + view.max_num_seqs)) / weight
        self.before = dict(self.policy.counters)
        backlog = {v.client for v in view.waiting}
        self.stayed, self.lifted = backlog & self.backlog, backlog - self.backlog
        self.backlog = backlog
        self.ranges = {pair: self.ranges.get(pair) for pair in combinations(sorted(backlog), 2)}
        for (f, g), span in self.ranges.items():
            d = self.service[f] - self.service[g]
            span = self.ranges[f, g] = [min(span[0], d), max(span[1], d)] if span else [d, d]
            if span[1] - span[0] > self.bound + EPS:
                self.fail(f"service of backlogged clients {f}, {g} diverged by {span[1] - span[0]:.1f} "
                          f"> VTC bound {self.bound:.1f}")

    def after_schedule(self, view, plan):
        after = self.policy.counters
        for client, value in self.before.items():
            if after.get(client, 0.0) < value - EPS:
                self.fail(f"counter of {client} decreased from {value} to {after.get(client)}")
        if self.stayed:
            floor = min(self.before.get(c, 0.0) for c in self.stayed)
            for client in self.lifted:
                if after.get(client, 0.0) < floor - EPS:
                    self.fail(f"client {client} became backlogged with counter {after.get(client)} "
                              f"< least backlogged counter {floor}")

    def after_step(self, engine):
        p = self.policy
        for r in engine.requests[:len(engine.trace)]:
            if r is None or r.first_scheduled_time is None:     # (closed loop: not arrived yet)
                continue
            seen = self.outputs.get(r.req_id)
            if seen is None:
                self.service[r.client] += p.w_in * r.prompt_len / p.weight(r.client)
                seen = 0
            self.service[r.client] += p.w_out * (len(r.output_ids) - seen) / p.weight(r.client)
            self.outputs[r.req_id] = len(r.output_ids)


PROPERTIES = {cls.name: cls for cls in (SinglePhase, StallFree, ChunkBudget, DrainedAdmission,
                                        AgingBound, MaxWait, VtcFairness)}
BUILTIN = {"policies.prefill_first.PrefillFirst": ("single_phase",)}


def declared_properties(policy) -> tuple:
    cls = type(policy)
    names = tuple(getattr(policy, "properties", ())) + BUILTIN.get(f"{cls.__module__}.{cls.__qualname__}", ())
    unknown = [n for n in names if n not in PROPERTIES]
    if unknown:
        raise ValueError(f"policy {cls.__name__} declares unknown properties {unknown}; "
                         f"known: {sorted(PROPERTIES)}")
    return names


def build_properties(policy, cfg, trace) -> list:
    return [PROPERTIES[name](policy, cfg, trace) for name in declared_properties(policy)]
