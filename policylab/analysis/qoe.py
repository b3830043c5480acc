"""Quality of experience of a streamed response (Andes: Liu et al., "Andes: Defining and Enhancing
Quality-of-Experience in LLM-Based Text Streaming Services", arXiv 2404.16283, §3.1).

A user reads a streamed answer at their own pace. The *expected* timeline: the first token at
`ttft` seconds after the request was sent, then one token every 1/`tds` seconds (`tds`, the
expected token delivery speed: a reading or listening pace). The *actual* timeline: token i
arrives at d_i; the client buffers tokens and the user reads them no faster than `tds`, so
token i is read at g_i = max(d_i, g_{i−1} + 1/tds). Tokens that arrive ahead of the expected
timeline are no better than on time, so the actual reading curve is capped by the expected one.
QoE is the area under the capped actual curve (tokens read by time t) over the area under the
expected curve, both up to the moment the user finishes reading the last token:

    QoE = Σ_i (T − m_i) / Σ_i (T − e_i),   e_i = ttft + i/tds,  m_i = max(g_i, e_i),
    T = m_{n−1} + 1/tds

QoE is 1 when every token arrives no later than expected; a first token D seconds late with
the rest on pace gives 1 / (1 + 2·tds·D / (n + 1)); a stall mid-stream costs the tokens read
late. m_i is i/tds + max(ttft, max_{j≤i}(d_j − j/tds)), a running maximum per request, so the
whole table is computed at once. A rejected request scores 0 (it delivered nothing); an
unfinished one (a partial run) has none. Times are measured from the request's arrival.

The expected TTFT and pace are the run's `qoe.ttft` and `qoe.tds` (`core.config.QoeConfig`): the defaults
are a 1 s first token and 5 tokens/s, an adult's silent reading speed (about 240 words a
minute, Brysbaert 2019) at about 1.3 tokens a word.
"""
from __future__ import annotations

import numpy as np

from policylab.core.config import QoeConfig


def check_qoe_config(cfg: QoeConfig) -> None:
    if not (isinstance(cfg.ttft, (int, float)) and cfg.ttft >= 0):
        raise ValueError(f"qoe.ttft must be a number of seconds >= 0, got {cfg.ttft!r}")
    if not (isinstance(cfg.tds, (int, float)) and cfg.tds > 0):
        raise ValueError(f"qoe.tds must be a number of tokens per second > 0, got {cfg.tds!r}")


def request_qoe(times: np.ndarray, rows: np.ndarray, arrival: np.ndarray, status: np.ndarray,
                cfg: QoeConfig) -> np.ndarray:
    """QoE per request: `times`/`rows` are the flat output-token times and their row indices
    (`metrics.flat_token_times`), `arrival` and `status` the table's columns."""
    n_rows = len(arrival)
    qoe = np.full(n_rows, np.nan)
    qoe[status == "rejected"] = 0.0
    count = np.bincount(rows, minlength=n_rows)
    finished = (status == "finished") & (count > 0)
    if not times.size or not finished.any():
        return qoe
    pace = 1.0 / cfg.tds
    first = np.concatenate([[0], np.cumsum(count)[:-1]])
    index = np.arange(times.size) - first[rows]                 # i: the token's place in its stream
    paced = index * pace                                         # i/tds
    late = times - arrival[rows]
    late -= paced                                                # d_i − i/tds
    read = _running_max(late, first, count)
    np.maximum(read, cfg.ttft, out=read)
    read += paced                                                # m_i
    last = first + count - 1
    end = read[last[count > 0]] + pace                           # T, per row with tokens
    n = count[count > 0].astype(np.float64)
    actual = n * end - np.bincount(rows, weights=read, minlength=n_rows)[count > 0]
    expected = n * end - (n * cfg.ttft + pace * n * (n - 1) / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.clip(actual / expected, 0.0, 1.0)
    has = np.flatnonzero(count > 0)
    qoe[has[finished[has]]] = value[finished[has]]
    return qoe


def _running_max(values: np.ndarray, first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The running maximum of `values` within each row's run of `count` entries from `first`
    (rows in order, runs contiguous). A stream whose first entry is its largest (no token later
    than that first one's lateness: the usual case, each token arriving faster than the reading
    pace) has that entry throughout, found in one vectorised pass; the others take one vectorised
    pass per place in a stream (the i-th token of every such stream at least i + 1 long)."""
    has = count > 0
    starts, lengths = first[has], count[has]
    if not lengths.size:
        return values.copy()
    out = np.repeat(values[starts], lengths)                  # each stream's first entry, throughout
    rising = np.maximum.reduceat(values, starts) > values[starts]   # (runs contiguous: reduceat by run)
    if not rising.any():
        return out
    starts, lengths = starts[rising], lengths[rising]
    at = np.repeat(starts - np.cumsum(np.concatenate([[0], lengths[:-1]])), lengths) + np.arange(lengths.sum())
    out[at] = values[at]                                      # those streams' own entries, then their maxima
    by_length = np.argsort(-lengths, kind="stable")          # longest streams first
    starts, longer = starts[by_length], -lengths[by_length]  # (negated lengths: ascending)
    for i in range(1, int(lengths.max())):
        at = starts[:np.searchsorted(longer, -i, side="left")] + i       # streams with an i-th token
        out[at] = np.maximum(out[at - 1], out[at])
    return out


def qoe_of(token_times: list, arrival: float, cfg: QoeConfig) -> float:
    """One finished request's QoE, token by token (the definition as written; tests compare)."""
    pace, read, prev = 1.0 / cfg.tds, [], None
    for i, d in enumerate(t - arrival for t in token_times):
        g = d if prev is None else max(d, prev + pace)
        prev = g
        read.append(max(g, cfg.ttft + i * pace))
    end = read[-1] + pace
    expected = sum(end - (cfg.ttft + i * pace) for i in range(len(read)))
    return min(1.0, sum(end - m for m in read) / expected)
