"""The per-replica timeline of a cluster run (cluster_timeline.png): how busy each replica was
over time, what it ran, and its queue — where a router's imbalance or a P/D split shows."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

TIME_BINS = 200


def cluster_timeline_figure(steps: pd.DataFrame, label: str, roles: dict | None = None) -> Figure:
    """Top: busy share of each replica per time bin (a heat map, one row per replica); middle:
    its prefill share of processed tokens; bottom: requests waiting + running, per replica."""
    replicas = sorted(steps["replica"].unique()) if len(steps) else []
    fig = Figure(figsize=(12, 3 + 1.2 * max(len(replicas), 2)), layout="constrained")
    fig.suptitle(f"{label}: per-replica timeline, {len(replicas)} replicas, {len(steps):,} steps")
    if not replicas:
        fig.text(0.5, 0.5, "no engine step ran", ha="center")
        return fig
    start, duration = steps["clock"].to_numpy(), steps["duration"].to_numpy()
    edges = np.linspace(start.min(), (start + duration).max(), TIME_BINS + 1)
    width = np.diff(edges)
    busy, prefill, queue = [], [], []
    for k in replicas:
        mine = steps["replica"].to_numpy() == k
        busy.append(np.histogram(start[mine], edges, weights=duration[mine])[0] / width)
        tokens = np.histogram(start[mine], edges, weights=(steps["prefill_tokens"] + steps["decode_tokens"])
                              .to_numpy()[mine])[0]
        prefill_tokens = np.histogram(start[mine], edges, weights=steps["prefill_tokens"].to_numpy()[mine])[0]
        prefill.append(np.divide(prefill_tokens, tokens, out=np.full(TIME_BINS, np.nan), where=tokens > 0))
        counts = np.histogram(start[mine], edges)[0]
        level = np.histogram(start[mine], edges, weights=(steps["waiting"] + steps["running"]).to_numpy()[mine])[0]
        queue.append(np.divide(level, counts, out=np.zeros(TIME_BINS), where=counts > 0))
    names = [f"{k}" + (f" {roles[str(k)]}" if roles and str(k) in roles else "") for k in replicas]
    heat, mix, lines = fig.subplots(3, 1, sharex=True, height_ratios=[len(replicas), len(replicas), 3])
    extent = (edges[0], edges[-1], len(replicas) - 0.5, -0.5)
    image = heat.imshow(np.clip(busy, 0, 1), aspect="auto", extent=extent, cmap="viridis", vmin=0, vmax=1,
                        interpolation="nearest")
    fig.colorbar(image, ax=heat, label="busy share")
    heat.set(title=f"busy share of each replica ({TIME_BINS} time bins)", ylabel="replica",
             yticks=range(len(replicas)), yticklabels=names)
    image = mix.imshow(np.asarray(prefill), aspect="auto", extent=extent, cmap="coolwarm", vmin=0, vmax=1,
                       interpolation="nearest")
    fig.colorbar(image, ax=mix, label="prefill share")
    mix.set(title="prefill share of the tokens each replica processed (blank: idle)", ylabel="replica",
            yticks=range(len(replicas)), yticklabels=names)
    for name, q in zip(names, queue):
        lines.stairs(q, edges, label=f"replica {name}")
    lines.set(title="requests waiting + running (mean over the bin's steps)", ylabel="requests",
              xlabel="replay clock (s)")
    lines.grid(alpha=0.3)
    lines.legend(fontsize="small", loc="upper left", ncols=min(len(replicas), 8))
    return fig
