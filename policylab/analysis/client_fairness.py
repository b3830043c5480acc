"""Per-client fairness of a replay (DESIGN §6): VTC service, service difference, Jain's index.

Service of client c: W_c = w_in·input tokens + w_out·output tokens processed (VTC's cost).
A request's whole prompt is credited at its first token (the prompt is processed by then;
chunk times are not recorded per request), each output token at its token time.

Jain's index is taken over *normalized* service x_c = W_c / D_c, where D_c is the work the
client asked for (w_in·prompt + w_out·target output over its trace requests). Raw W_c would
call a replay unfair merely because one client sends less; x_c = 1 for every client means
each got all it asked for, and equal x_c means each got the same share of its demand.

The service difference is the cumulative W_c of the backlogged clients (an arrived request
not yet finished or rejected), max − min, evaluated after every event. It is undefined while
fewer than two clients are backlogged; its mean is weighted by time over the rest.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from policylab.analysis.fairness_events import Events, jain_index  # noqa: F401 (jain_index: part of this API)
from policylab.core.config import FairnessConfig

MAX_CELLS = 1 << 22   # time rows × clients held at once: bounds memory with many clients


def service_difference(service: Events, backlog: Events, num_clients: int) -> tuple[float, float]:
    """(max, time-weighted mean) of max − min cumulative service over backlogged clients.

    `service` credits service; `backlog` holds +1 (arrival) / −1 (done) per request. The
    state after all events at a time counts for that time. (0, 0) if never two are backlogged.
    One sort of all events, then a (time rows × clients) table of running totals for a block
    of rows at a time, holding only the clients that can be backlogged in that block: cost
    grows with rows × concurrently backlogged clients, memory stays under MAX_CELLS.
    """
    time = np.concatenate([service.time, backlog.time])
    if num_clients < 2 or time.size == 0:
        return 0.0, 0.0
    order = np.argsort(time, kind="stable")   # timsort: token times come in nearly sorted runs
    time = time[order]
    client = np.concatenate([service.client, backlog.client])[order]
    value = np.concatenate([service.value, backlog.value])[order]
    is_backlog = order >= service.time.size
    new_time = np.concatenate([[True], time[1:] != time[:-1]])
    row, times = np.cumsum(new_time) - 1, time[new_time]
    diff = np.empty(times.size)
    served, waiting = np.zeros(num_clients), np.zeros(num_clients)   # totals before row r0
    r0 = lo = 0
    while r0 < times.size:
        r1, hi, ids = _next_block(r0, lo, row, client, is_backlog, waiting > 0.5, times.size)
        c, v, b = client[lo:hi], value[lo:hi], is_backlog[lo:hi]
        diff[r0:r1] = _block_difference(row[lo:hi] - r0, c, v, b, r1 - r0, ids, served, waiting)
        if r1 < times.size:
            served += np.bincount(c[~b], weights=v[~b], minlength=num_clients)
            waiting += np.bincount(c[b], weights=v[b], minlength=num_clients)
        r0, lo = r1, hi
    defined = ~np.isnan(diff)
    if not defined.any():
        return 0.0, 0.0
    weights = np.diff(times, append=times[-1])[defined]
    values = diff[defined]
    mean = np.dot(values, weights) / weights.sum() if weights.sum() > 0 else values.mean()
    return float(values.max()), float(mean)


def _next_block(r0, lo, row, client, is_backlog, backlogged, n_rows):
    """End row, end event and clients that can be backlogged for the block starting at r0.

    Clients = backlogged at r0 or arriving in the block; the block shrinks until
    rows × clients fits MAX_CELLS (or is a single row).
    """
    r1 = min(n_rows, r0 + max(1, MAX_CELLS // (2 * max(1, backlogged.sum()))))
    while True:
        hi = np.searchsorted(row, r1)
        relevant = backlogged.copy()
        relevant[client[lo:hi][is_backlog[lo:hi]]] = True
        ids = np.flatnonzero(relevant)
        if (r1 - r0) * 2 * ids.size <= MAX_CELLS or r1 == r0 + 1:
            return r1, hi, ids
        r1 = r0 + max(1, min((r1 - r0) // 2, MAX_CELLS // (2 * ids.size)))


def _block_difference(rows, client, value, is_backlog, n_rows, ids, served, waiting) -> np.ndarray:
    """Per row of one block: max − min service of the backlogged clients among `ids` (NaN if < 2)."""
    k = ids.size
    if k < 2:
        return np.full(n_rows, np.nan)
    if k < served.size:                  # keep only the events of the clients in `ids`
        compact = np.full(served.size, -1)
        compact[ids] = np.arange(k)
        client = compact[client]
        keep = client >= 0
        rows, client, value, is_backlog = rows[keep], client[keep], value[keep], is_backlog[keep]
    cells = rows * (2 * k) + client + k * is_backlog
    per_row = np.bincount(cells, weights=value, minlength=n_rows * 2 * k).reshape(n_rows, 2 * k)
    totals = np.cumsum(per_row, axis=0) + np.concatenate([served[ids], waiting[ids]])
    service, active = totals[:, :k], totals[:, k:] > 0.5
    high = np.where(active, service, -np.inf).max(axis=1)
    low = np.where(active, service, np.inf).min(axis=1)
    return np.where(active.sum(axis=1) >= 2, high - low, np.nan)


def client_fairness(table: pd.DataFrame, facts, cfg: FairnessConfig, end_time: float) -> dict:
    """Fairness of one replay from its request table (see `policylab.analysis.metrics.request_table`):
    the whole-run numbers under "fairness", the windowed ones (`fairness_windows`) under "windows".

    `facts` (metrics.TokenFacts) gives the output tokens' service as (time, client, tokens) events.
    Requests arriving after `end_time` never arrived (a run cut short) and are not backlogged.
    """
    names, client = np.unique(table["client"].to_numpy(dtype=str), return_inverse=True)
    client = client.reshape(-1)
    n = len(names)
    prompt = table["prompt_tokens"].to_numpy(dtype=np.float64)
    first_token = table["first_token_time"].to_numpy(dtype=np.float64)
    prefilled = ~np.isnan(first_token)
    service = Events(np.concatenate([first_token[prefilled], facts.service_time]),
                     np.concatenate([client[prefilled],
                                     np.searchsorted(names, facts.service_client.astype(str))]),
                     np.concatenate([cfg.w_in * prompt[prefilled],
                                     float(cfg.w_out) * facts.service_tokens]))
    arrival = table["arrival_time"].to_numpy(dtype=np.float64)
    finish = table["finish_time"].to_numpy(dtype=np.float64)
    arrived = arrival <= end_time
    done = ~np.isnan(finish)
    backlog = Events(np.concatenate([arrival[arrived], finish[done]]),
                     np.concatenate([client[arrived], client[done]]),
                     np.concatenate([np.ones(arrived.sum()), -np.ones(done.sum())]))
    generated = table["generated_tokens"].to_numpy(dtype=np.float64)
    received = np.bincount(client, weights=cfg.w_in * prompt * prefilled + cfg.w_out * generated,
                           minlength=n)
    demand = np.bincount(client, minlength=n, weights=cfg.w_in * prompt
                         + cfg.w_out * table["output_tokens"].to_numpy(dtype=np.float64))
    asked = demand > 0
    worst, mean = service_difference(service, backlog, n)
    from policylab.analysis.fairness_windows import window_fairness
    start = float(arrival.min()) if arrival.size else float("nan")
    return {"num_clients": n, "jain_index": jain_index(received[asked] / demand[asked]),
            "service_difference_max": worst, "service_difference_mean": mean,
            "windows": window_fairness(service, backlog, n, start, end_time, getattr(cfg, "window", None))}
