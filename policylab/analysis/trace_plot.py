"""PNG of a trace: arrival rate over time and the prompt / output length histograms."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_trace(reqs: list, out_png, title: str = "") -> Path:
    import matplotlib
    matplotlib.use("Agg")            # files only, no display needed
    import matplotlib.pyplot as plt

    times = np.array([r.arrival_time for r in reqs])
    duration = max(float(times[-1] - times[0]), 1e-9)
    bins = int(np.clip(duration, 10, 200))           # ~1 s bins for short traces, at most 200
    counts, edges = np.histogram(times, bins=bins)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].step(edges[:-1], counts / np.diff(edges), where="post")
    axes[0].set(xlabel="time (s)", ylabel="arrivals / s", title=f"arrival rate ({duration / bins:.3g} s bins)")
    for ax, name in zip(axes[1:], ("prompt_tokens", "output_tokens")):
        values = np.array([getattr(r, name) for r in reqs])
        log_scale = values.max() > 20 * max(np.median(values), 1)
        edges_v = np.geomspace(max(values.min(), 1), values.max() + 1, 50) if log_scale else 50
        ax.hist(values, bins=edges_v)
        ax.set(xlabel=name.replace("_", " "), ylabel="requests", title=f"{name} (mean {values.mean():.0f})")
        if log_scale:
            ax.set_xscale("log")
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
