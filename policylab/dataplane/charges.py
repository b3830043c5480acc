"""Per-request energy charges of a meter, logged a step at a time and added up in bulk.

A meter charges every request in a step its share of the step's energy
(`policylab.dataplane.energy`): most steps charge the same few dozen running decodes one amount
each. Adding it to each member's total as it came, one Python operation per request per step,
was most of the meter's work. Here a step's charge is logged (its req_ids copied at C speed,
converted only when they are not the ones charged before, and the amount), and the log is applied in bulk
(every `APPLY_PAIRS` charges, and before the totals are read) by `numpy.add.at`, which adds each
(request, amount) in the order given, one at a time: every total is the float that adding each
amount as it came gives, bit for bit (float addition is not associative, so a sum per request
in any other order, or a difference of prefix sums, would not be).
"""
from __future__ import annotations

from array import array

import numpy as np

APPLY_PAIRS = 1 << 16     # logged (request, amount) pairs that are applied at once (bounds the log's memory)


class Charges:
    """Joules charged to each request: `charge` and `charge_one` log, `totals` reads (module doc)."""

    def __init__(self):
        self._total = np.zeros(1024)        # req_id -> J applied so far (0.0: nothing yet; every charge is > 0)
        self._ids = array("Q")              # logged charges: the req_ids, in order ...
        self._counts: list = []             # ... in runs of this many ...
        self._amounts: list = []            # ... charged this many J each
        self._last, self._run = [], array("Q")   # the ids last charged, as given and as logged

    def charge(self, ids: list, amount: float, count: int | None = None) -> None:
        """Charge `amount` to each of the first `count` (None: all) of `ids`, distinct req_ids >= 0
        (a list that does not change once charged, as a Batch's lists do not)."""
        if count is not None and count < len(ids):
            ids = ids[:count]
        if ids is not self._last and ids != self._last:   # (most steps charge the same running decodes)
            self._run = array("Q", ids)
        self._last = ids
        self._ids += self._run
        self._counts.append(len(ids))
        self._amounts.append(amount)
        if len(self._ids) >= APPLY_PAIRS:
            self._apply()

    def charge_one(self, req_id: int, amount: float) -> None:
        """Charge `amount` to one request."""
        self._ids.append(req_id)
        self._counts.append(1)
        self._amounts.append(amount)

    def totals(self) -> dict:
        """req_id -> J charged so far (requests charged nothing left out)."""
        self._apply()
        return {i: j for i, j in enumerate(self._total.tolist()) if j}

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
