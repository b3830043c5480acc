"""What both fairness measures are computed from: per-client events (service received, requests
entering and leaving the backlog) and Jain's index (DESIGN §6)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Events(NamedTuple):
    """Parallel arrays: at `time`, `client` (index) changes by `value`."""

    time: np.ndarray
    client: np.ndarray
    value: np.ndarray


def jain_index(x) -> float:
    """(Σx)² / (n·Σx²): 1 when all equal, 1/n when one client gets everything; NaN if undefined."""
    x = np.asarray(x, dtype=np.float64)
    square_sum = float(np.dot(x, x))
    if x.size == 0 or square_sum == 0.0:
        return float("nan")
    return float(x.sum() ** 2 / (x.size * square_sum))
