"""`Run`: a run directory as Python objects (what `policylab.replay` returns).

Everything is read from the directory's files, when first asked for, so a `Run` works the
same for a replay just made, one made by the CLI, or one made on another machine:
`policylab.Run("outputs/...")`.
"""
from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

METRICS = ("ttft", "tpot", "e2e", "queueing_delay", "normalized_latency")


class Run:
    """One run directory: `.summary` (summary.json as a dict), `.requests` and `.steps`
    (the parquet files as pandas DataFrames), `.dir`, `.plots` (its PNG figures by name) and
    `.cdf(...)` (a latency CDF drawn on matplotlib axes, to put runs side by side)."""

    def __init__(self, dir, summary: dict | None = None):
        self.dir = Path(dir)
        if summary is None and not (self.dir / "summary.json").is_file():
            raise FileNotFoundError(f"{self.dir}: not a run directory (no summary.json)")
        if summary is not None:
            self.__dict__["summary"] = summary

    def __repr__(self) -> str:
        s = self.summary
        attainment = s.get("slo_attainment")
        shown = "—" if attainment is None else f"{attainment:.1%}"
        return (f"Run({str(self.dir)!r}: {s.get('policy')} on {s.get('config', {}).get('trace', {}).get('name')}, "
                f"{s.get('status')}, SLO attainment {shown})")

    @cached_property
    def summary(self) -> dict:
        return json.loads((self.dir / "summary.json").read_text())

    @property
    def status(self) -> str:
        """complete, or partial (a broken contract, an exception, a stop signal: see `error`)."""
        return self.summary.get("status", "?")

    @property
    def error(self) -> str | None:
        return self.summary.get("error")

    @property
    def policy(self) -> str:
        return self.summary.get("policy", "?")

    @cached_property
    def requests(self):
        """One row per trace request (finished, rejected with its reason, or unfinished)."""
        import pandas as pd
        return pd.read_parquet(self.dir / "requests.parquet")

    @cached_property
    def steps(self):
        """One row per engine step (batch composition, KV use, queue lengths, duration)."""
        import pandas as pd
        return pd.read_parquet(self.dir / "steps.parquet")

    @property
    def plots(self) -> dict:
        """The run's figures, {name: path of the PNG} (none when it ran with plots=false)."""
        return {p.stem: p for p in sorted(self.dir.glob("*.png"))}

    def show(self, name: str):
        """A figure of `plots` for a notebook cell (an IPython Image)."""
        from IPython.display import Image
        if name not in self.plots:
            raise KeyError(f"{self.dir} has no figure {name!r}; it has {', '.join(self.plots) or 'none'}")
        return Image(filename=str(self.plots[name]))

    def cdf(self, metric: str = "ttft", ax=None, label: str | None = None):
        """Empirical CDF of a per-request latency of the finished requests (seconds) on `ax`
        (new axes when None); returns the axes, so runs can share one: `b.cdf(ax=a.cdf())`."""
        import numpy as np
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
        if ax is None:
            import matplotlib.pyplot as plt
            ax = plt.subplots(figsize=(5, 3.5))[1]
        done = self.requests[self.requests["status"] == "finished"]
        values = np.sort(done[metric].dropna().to_numpy(dtype=float))
        ax.step(values, np.arange(1, len(values) + 1) / max(len(values), 1), where="post",
                label=label or self.policy)
        ax.set_xlabel(f"{metric} (s)")
        ax.set_ylabel("share of requests")
        ax.legend()
        return ax
