"""Per-request energy charges of a meter, logged a step at a time and added up in bulk.

A meter charges every request in a step its share of the step's energy
(`policylab.dataplane.energy`): a step charges a few dozen running decodes one amount each and
its prefill chunks their tokens' worth. Adding it to each member's total as it came, one Python
operation per request per step, was most of the meter's work. Here a step's charges are logged
(its req_ids converted at C speed, and the amounts in runs), and the log is applied in bulk
(every `APPLY_PAIRS` charges, and before the totals are read) by `numpy.add.at`, which adds each
(request, amount) in the order given, one at a time: every total is the float that adding each
amount as it came gives, bit for bit (float addition is not associative, so a sum per request
in any other order, or a difference of prefix sums, would not be).
"""
from __future__ import annotations

from array import array
from collections.abc import Mapping

import numpy as np

APPLY_PAIRS = 1 << 16     # logged (request, amount) pairs that are applied at once (bounds the log's memory)


class Charges:
    """Joules charged to each request: `charge` and `charge_tokens` log, `totals` reads (module doc)."""

    def __init__(self):
        self._total = np.zeros(1024)        # req_id -> J applied so far (0.0: nothing yet; every charge is > 0)
        self._ids = array("Q")              # logged charges: the req_ids, in order ...
        self._counts: list = []             # ... in runs of this many ...
        self._amounts: list = []            # ... charged this many J each

    def charge(self, ids: list, amount: float, count: int | None = None) -> None:
        """Charge `amount` to each of the first `count` (None: all) of `ids`, a list of distinct req_ids >= 0."""
        if count is not None and count < len(ids):
            ids = ids[:count]
        self._ids.fromlist(ids)
        self._counts.append(len(ids))
        self._amounts.append(amount)
        if len(self._ids) >= APPLY_PAIRS:
            self._apply()

    def charge_tokens(self, ids: list, amount: float, decodes: int, tokens: list) -> None:
        """Charge a step's requests `amount` a token: the first `decodes` of `ids` (a list of distinct
        req_ids >= 0) computed one token each, every other one its entry of `tokens`."""
        self._ids.fromlist(ids)                 # (the step's requests in one conversion)
        counts, amounts = self._counts, self._amounts
        if decodes:
            counts.append(decodes)
            amounts.append(amount)              # (amount x 1: the same float)
        i, entries = decodes, len(ids)
        while i < entries:                      # (the few prefill chunks by index: no range object)
            counts.append(1)
            amounts.append(amount * tokens[i])
            i += 1
        if len(self._ids) >= APPLY_PAIRS:
            self._apply()

    def totals(self) -> "Totals":
        """req_id -> J charged so far (requests charged nothing left out)."""
        self._apply()
        return Totals(self._total.copy())

    def _apply(self) -> None:
        """Add the logged charges to the totals, pair by pair in the order they were charged."""
        if not self._ids:
            return
        ids = np.frombuffer(self._ids, np.int64)
        amounts = np.repeat(np.array(self._amounts, np.float64), self._counts)
        top = int(ids.max()) + 1
        if top > len(self._total):
            self._total = np.concatenate((self._total, np.zeros(max(top, 2 * len(self._total)) - len(self._total))))
        np.add.at(self._total, ids, amounts)        # (unbuffered: each pair in turn, repeats accumulating)
        del ids                                     # (releases the log's buffer)
        self._ids, self._counts, self._amounts = array("Q"), [], []


class Totals(Mapping):
    """req_id -> J charged, read-only, held as one array indexed by req_id (0.0: nothing charged,
    and not a key): a million requests' totals are 8 MB here, where a dict of them is over 100 MB
    at the end of a run, when the results need the most memory."""

    def __init__(self, joules: np.ndarray):
        self.joules = joules

    @classmethod
    def summed(cls, parts: list) -> "Totals":
        """Each request's joules over `parts` (Totals), added in order: a request charged in one
        part only has that part's float (0.0 + x is x)."""
        joules = np.zeros(max((len(p.joules) for p in parts), default=0))
        for p in parts:
            joules[:len(p.joules)] += p.joules
        return cls(joules)

    def at(self, req_ids: np.ndarray) -> np.ndarray:
        """The joules of each of `req_ids` (0.0 for one never charged)."""
        req_ids = np.asarray(req_ids, dtype=np.int64)
        inside = req_ids < len(self.joules)
        out = np.zeros(len(req_ids))
        out[inside] = self.joules[req_ids[inside]]
        return out

    def __getitem__(self, req_id) -> float:
        if not (0 <= req_id < len(self.joules)) or not self.joules[req_id]:
            raise KeyError(req_id)
        return float(self.joules[req_id])

    def __iter__(self):
        return iter(np.flatnonzero(self.joules).tolist())

    def __len__(self) -> int:
        return int(np.count_nonzero(self.joules))
