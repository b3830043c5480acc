"""Fairness over time, in windows: what VTC (Sheng et al., OSDI '24) bounds and what a
whole-run number hides.

Over a whole run every client that is eventually served gets all it asked for, so a
whole-run Jain index is ~1 for any policy that finishes the trace. VTC's guarantee is about
*backlogged* clients: while two clients both have work waiting, the service they receive
should not drift apart. So the run is cut into windows (`fairness.window` seconds, default
1/20 of the run); in each window the clients **backlogged throughout it** (an arrived request
not yet finished or rejected at every moment of the window) are compared on the service they
received *in that window* (VTC's cost, w_in · prompt tokens + w_out · output tokens):

- service difference: max − min of their window service (VTC's measure; 0 = equal service);
- Jain's index of their window service: (Σx)² / (n·Σx²), 1 = equal, 1/n = one client got all.

A window with fewer than two such clients has no contention to judge and is left out; the
summary reports how many windows were contended, and over those the mean and worst value.
"""
from __future__ import annotations

import numpy as np

from policylab.analysis.fairness_events import Events, jain_index

DEFAULT_WINDOWS = 20


def backlogged_throughout(backlog: Events, num_clients: int, edges: np.ndarray) -> np.ndarray:
    """(windows × clients) bool: the client has an open request at every instant of the window
    [edges[k], edges[k+1]) (its state after all events at a time counts for that time)."""
    k = edges.size - 1
    out = np.zeros((k, num_clients), dtype=bool)
    order = np.lexsort((backlog.time, backlog.client))
    client, time, value = backlog.client[order], backlog.time[order], backlog.value[order]
    bounds = np.searchsorted(client, np.arange(num_clients + 1))
    for c in range(num_clients):
        t, state = time[bounds[c]:bounds[c + 1]], np.cumsum(value[bounds[c]:bounds[c + 1]])
        if t.size == 0:
            continue
        last = np.concatenate([t[1:] != t[:-1], [True]])          # the state after all events at a time
        t, state = t[last], state[last]
        at_start = np.searchsorted(t, edges[:-1], side="right") - 1
        open_at_start = np.where(at_start >= 0, state[np.maximum(at_start, 0)], 0) > 0.5
        zero_times = t[state < 0.5]
        zeros_inside = np.searchsorted(zero_times, edges[1:], side="left") - \
            np.searchsorted(zero_times, edges[:-1], side="right")
        out[:, c] = open_at_start & (zeros_inside == 0)
    return out


def window_fairness(service: Events, backlog: Events, num_clients: int, start: float, end: float,
                    window: float | None = None) -> dict:
    """Per-window service difference and Jain index of the backlogged clients (module doc)."""
    empty = {"window_s": None, "windows": 0, "contended_windows": 0, "service_difference_mean": None,
             "service_difference_max": None, "jain_mean": None, "jain_min": None}
    if num_clients < 2 or not (np.isfinite(start) and np.isfinite(end) and end > start):
        return empty
    width = float(window) if window else (end - start) / DEFAULT_WINDOWS
    k = max(1, int(np.floor((end - start) / width + 1e-9)))
    edges = start + width * np.arange(k + 1)
    index = np.floor((service.time - start) / width).astype(np.int64)
    keep = (index >= 0) & (index < k)
    served = np.bincount(index[keep] * num_clients + service.client[keep], weights=service.value[keep],
                         minlength=k * num_clients).reshape(k, num_clients)
    waiting = backlogged_throughout(backlog, num_clients, edges)
    contended = waiting.sum(axis=1) >= 2
    if not contended.any():
        return {**empty, "window_s": width, "windows": k}
    diffs, jains = [], []
    for row, mask in zip(served[contended], waiting[contended]):
        x = row[mask]
        diffs.append(float(x.max() - x.min()))
        jains.append(jain_index(x))
    jains = np.asarray(jains)
    finite = jains[np.isfinite(jains)]
    return {"window_s": width, "windows": k, "contended_windows": int(contended.sum()),
            "service_difference_mean": float(np.mean(diffs)), "service_difference_max": float(np.max(diffs)),
            "jain_mean": float(finite.mean()) if finite.size else None,
            "jain_min": float(finite.min()) if finite.size else None}
