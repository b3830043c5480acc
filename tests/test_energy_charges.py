"""The meter's per-request charges (policylab.dataplane.charges): logged a step at a time and
applied in bulk, every total is bit for bit the float the charges give added one at a time as
they came, whatever the set of running decodes does between steps."""
from __future__ import annotations

import random

import numpy as np
import pytest

import policylab.dataplane.charges as charges_module
from policylab.core.batch import Batch
from policylab.core.config import HardwareConfig, ModelConfig
from policylab.apps.sim_check import load_group
from policylab.dataplane.charges import Charges
from policylab.dataplane.energy import EnergyMeter, StepWork
from policylab.dataplane.shape import ModelShape

pytestmark = pytest.mark.timeout(120)

LLAMA = load_group("model", "llama3-8b", ModelConfig)
H100 = load_group("hardware", "h100", HardwareConfig)


def eager(events) -> dict:
    """The reference: each charge added to its request's total as it comes."""
    total = {}
    for ids, amount, count in events:
        for r in ids[:count]:
            total[r] = total.get(r, 0.0) + amount
    return total


def random_events(rng: random.Random, steps: int) -> list:
    """Running decodes that join at the end, leave from anywhere, are charged alone or with a
    cut-off count, and are re-sent as equal lists or as the very same list."""
    members, nxt, events = [], 0, []
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.2:
            members = members + list(range(nxt, nxt + rng.randint(1, 3)))
            nxt = members[-1] + 1
        elif roll < 0.4 and members:
            gone = rng.sample(members, rng.randint(1, min(3, len(members))))
            members = [r for r in members if r not in gone]
        elif roll < 0.45 and len(members) > 1:                       # the same size, one member swapped
            members = members[:-1] + [nxt]
            nxt += 1
        same = events and rng.random() < 0.3 and events[-1][0] == members
        ids = events[-1][0] if same else list(members)
        count = rng.randint(0, len(ids)) if rng.random() < 0.2 else len(ids)
        events.append((ids, rng.uniform(0.01, 3.0) * 10 ** rng.randint(-3, 3), count))
        if rng.random() < 0.3:                                       # a prefill chunk charged alone
            events.append(([rng.randrange(nxt + 5)], rng.uniform(0.1, 50.0), 1))
    return events


@pytest.mark.parametrize("seed", range(4))
def test_totals_are_bit_for_bit_the_charges_added_as_they_came(seed, monkeypatch):
    monkeypatch.setattr(charges_module, "APPLY_PAIRS", 37)          # applied many times over the run
    events = random_events(random.Random(seed), 600)
    c = Charges()
    half = len(events) // 2
    for i, (ids, amount, count) in enumerate(events):
        if len(ids) == 1 and count == 1 and i % 2:
            c.charge_tokens(ids, amount, 0, [1])              # (a lone chunk of one token)
        else:
            c.charge(ids, amount, count if count < len(ids) else None)
        if i == half:
            assert c.totals() == {r: j for r, j in eager(events[:half + 1]).items() if j}   # read mid-run
    want = eager(events)
    got = c.totals()
    assert got == {r: j for r, j in want.items() if j}
    assert all(got[r].hex() == want[r].hex() for r in got)


def test_a_different_set_of_the_same_size_is_charged_as_itself():
    c = Charges()
    c.charge([1, 2, 3], 1.0)
    c.charge([1, 2, 4], 2.0)                                         # one left, one joined: not the last set
    c.charge([1, 2, 4], 4.0, count=2)
    assert c.totals() == {1: 7.0, 2: 7.0, 3: 1.0, 4: 2.0}


def batch(q, ctx, ids, decodes=0):
    return Batch(req_ids=list(ids), query_lens=list(q), context_lens=list(ctx), sample=[True] * len(q),
                 decodes=decodes)


def test_a_request_that_leaves_mid_run_is_charged_what_the_eager_meter_charged():
    """Requests 0-3 decode; 1 finishes after two steps, 4 joins from a prefill chunk: each one's joules
    are its shares step by step, added in the order of the steps."""
    meter = EnergyMeter(ModelShape(LLAMA), H100, gpus=1)
    steps = [batch([1] * 4, [300] * 4, [0, 1, 2, 3], 4),
             batch([1, 1, 1, 1, 200], [301] * 4 + [0], [0, 1, 2, 3, 4], 4),
             batch([1, 1, 1, 1], [302, 302, 302, 200], [0, 2, 3, 4], 4),
             batch([1, 1, 1, 1], [303, 303, 303, 201], [0, 2, 3, 4], 4),
             batch([1, 1, 1, 64], [304, 304, 202, 0], [0, 3, 4, 5], 3)]
    shares = {}
    for b in steps:
        tokens = sum(b.query_lens)
        e = meter.step(b, tokens, len(b), 0.02)
        for r, n in zip(b.req_ids, b.query_lens):
            shares.setdefault(r, []).append(e / tokens * n if tokens > len(b) else e / len(b))
    per = meter.report()["per_request_j"]
    want = {}
    for r, parts in shares.items():              # (each decode-only step here sends a new list: no runs)
        x = 0.0
        for p in parts:
            x += p
        want[r] = x
    assert per == want and len(shares[1]) == 2 and len(shares[5]) == 1


@pytest.mark.parametrize("gpus", [1, 4])
def test_the_plain_step_s_energy_is_the_general_path_s_float(gpus):
    """A step at the set clock with the cost model's kernel share takes the plain path; the same step
    through demand / running / over_step (the clock ratio given) has the same joules, bit for bit."""
    rng = random.Random(gpus)
    fast, general = (EnergyMeter(ModelShape(LLAMA), H100, gpus=gpus) for _ in range(2))
    work = StepWork(ModelShape(LLAMA))
    for i in range(400):
        n = rng.randint(1, 300)
        b = batch([1] * n, [rng.randint(0, 20000) for _ in range(n)], range(n), n)
        w = work.of(b.query_lens, b.context_lens, n, n, n)
        if i % 3 == 0:                                               # compute-bound to idle: the caps and floors
            w = (w[0] * rng.uniform(0, 50), w[1] * rng.uniform(0, 50), w[2] * rng.uniform(0, 3))
        duration = rng.uniform(1e-4, 0.1)
        share = rng.choice((0.0, 1.0, rng.random()))
        e = fast.step(b, n, n, duration, None, w, share)
        assert e.hex() == general.step(b, n, n, duration, general.ratio, w, share).hex()
    assert fast.report() == general.report()


def test_totals_read_as_a_mapping_and_by_array_and_add_across_meters_as_a_dict_would():
    """Totals (one array by req_id) answer as the dict of the charged requests did; summed over a
    cluster's meters each request's joules are the floats that adding its parts in order gives."""
    rng = random.Random(7)
    parts = []
    for _ in range(3):
        c = Charges()
        for ids, amount, count in random_events(rng, 40):
            c.charge(ids, amount, count)
        parts.append(c.totals())
    want = {}
    for p in parts:
        as_dict = dict(p.items())
        assert as_dict == p and len(as_dict) == len(p) and all(j > 0 for j in as_dict.values())
        for r, j in as_dict.items():
            want[r] = want.get(r, 0.0) + j
    total = charges_module.Totals.summed(parts)
    assert dict(total.items()) == want                       # bit for bit: == on the floats
    beyond = len(total.joules) + 5
    ids = [*sorted(want)[:3], beyond]
    assert total.at(ids).tolist() == [want[r] for r in ids[:3]] + [0.0]
    with pytest.raises(KeyError):
        total[beyond]
    assert charges_module.Totals(np.array([0.0, 0.5, 0.0, 0.0, 2.0])) == {1: 0.5, 4: 2.0}     # (0.0: no key)
