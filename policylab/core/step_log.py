"""Per-step records in one typed buffer (DESIGN §6 inputs): 8 bytes a field, no Python objects.

A million-request replay runs millions of steps; a tuple of Python numbers per step cost
~200 bytes where the numbers need 96. Every field is stored as a float64 (step counts and
block counts are far below 2**53, so they come back exact) and read back as numpy columns.
"""
from __future__ import annotations

from array import array

import numpy as np

from policylab.core.result import STEP_FIELDS

FLOAT_FIELDS = ("clock", "duration")


class StepLog:
    def __init__(self):
        self._rows = array("d")
        self.append = self._rows.fromlist        # append(row): one row (a list) in STEP_FIELDS
                                                 # order (fromlist: half of extend's cost per row)
        self._width = len(STEP_FIELDS)

    def __len__(self) -> int:
        return len(self._rows) // self._width

    def columns(self, start: int = 0, stop: int | None = None) -> dict:
        """Rows [start, stop) as STEP_FIELDS -> numpy column (float64 clock/duration, int64 the rest)."""
        stop = len(self) if stop is None else stop
        w = self._width
        table = np.frombuffer(self._rows, dtype=np.float64)[start * w:stop * w].reshape(-1, w)
        return {k: table[:, i].copy() if k in FLOAT_FIELDS else table[:, i].astype(np.int64)
                for i, k in enumerate(STEP_FIELDS)}
