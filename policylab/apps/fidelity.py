"""Sim-vs-real fidelity: replay one trace on the real data plane and on the calibrated sim.

Sweeps run on the sim because it is thousands of times faster; its numbers are worth
something only if it predicts the real plane. This job replays the same trace, policy
and KV size on both and reports the relative error of each latency metric.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from policylab.analysis.results import summarize_run
from policylab.apps.calibrate import calibrate
from policylab.apps.config import RunConfig, typed_config
from policylab.apps.jobs import build_engine, build_policy, dataplane_of, replay
from policylab.core.config import DataplaneConfig
from policylab.core.engine import Engine
from policylab.dataplane.fitted import Calibration, load_calibration
from policylab.dataplane.sim import SimDataPlane
from policylab.traces import load_trace

METRICS = ("ttft", "tpot", "itl", "e2e")
STATS = ("mean", "p50", "p99")


def _values(summary: dict) -> list:
    return [summary[m][s] for m in METRICS for s in STATS] + [summary["makespan"]]


def error_table(real: dict, sim: dict, real_again: dict) -> pd.DataFrame:
    """Relative error of the sim, next to the real plane's own run-to-run difference (noise floor)."""
    names = [f"{m} {s}" for m in METRICS for s in STATS] + ["makespan"]
    df = pd.DataFrame({"metric": names, "real": _values(real), "sim": _values(sim),
                       "real_again": _values(real_again)})
    df["rel_error"] = (df["sim"] - df["real"]).abs() / df["real"].abs()
    df["real_noise"] = (df["real_again"] - df["real"]).abs() / df["real"].abs()
    return df


def fidelity(cfg: RunConfig, run_dir: Path) -> pd.DataFrame:
    cfg = typed_config(cfg)
    if cfg.dataplane.kind != "torch":
        raise ValueError("fidelity compares against the real data plane: use dataplane=torch")
    path = cfg.dataplane.calibration
    real_plane = dataplane_of(cfg)
    calib = load_calibration(path) if path else calibrate(real_plane, cfg.engine, run_dir, cfg.seed)
    path = path or str(run_dir / "calibration.json")
    real_engine = build_engine(cfg, real_plane)
    real = replay(real_engine, cfg.progress)
    again_engine = build_engine(cfg, real_plane)     # the same replay once more: measurement noise
    again = replay(again_engine, cfg.progress)
    sim_plane = SimDataPlane(cfg.model, cfg.hardware, DataplaneConfig(kind="sim", calibration=path), cfg.seed)
    engine_cfg = dataclasses.replace(cfg.engine, num_blocks=real_engine.kv.num_blocks)
    sim_engine = Engine(load_trace(cfg.trace, seed=cfg.seed), build_policy(cfg.policy), sim_plane,
                        engine_cfg, seed=cfg.seed, prefix_block_tokens=cfg.trace.prefix_block_tokens)
    sim = replay(sim_engine, cfg.progress)
    (real_req, _, real_sum), (sim_req, _, sim_sum) = summarize_run(real, cfg), summarize_run(sim, cfg)
    table = error_table(real_sum, sim_sum, summarize_run(again, cfg)[2])
    table.to_csv(run_dir / "fidelity.csv", index=False)
    (run_dir / "fidelity.md").write_text(_markdown(table, cfg, calib))
    _plot_cdfs(real_req, sim_req, run_dir / "fidelity_cdf.png", real_engine.policy_name)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"fidelity report: {run_dir / 'fidelity.md'}")
    return table


def _markdown(table: pd.DataFrame, cfg, calib: Calibration) -> str:
    lines = [f"# Sim vs real: policy {cfg.policy.name}, trace {cfg.trace.name}, model {cfg.model.name}", "",
             f"Calibration held-out MAPE: {calib.meta.get('heldout_mape', float('nan')):.1%}. "
             "`real noise` is how far a second real replay of the same config lands from the first: "
             "sim errors below it are within what the real plane itself reproduces.", "",
             "| metric | real (s) | sim (s) | sim error | real noise |", "|---|---|---|---|---|"]
    lines += [f"| {r.metric} | {r.real:.4f} | {r.sim:.4f} | {r.rel_error:.1%} | {r.real_noise:.1%} |"
              for r in table.itertuples()]
    return "\n".join(lines) + "\n"


def _plot_cdfs(real: pd.DataFrame, sim: pd.DataFrame, path: Path, policy: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, col in zip(axes, ("ttft", "tpot", "e2e")):
        for df, label, style in ((real, "real", "-"), (sim, "sim (calibrated)", "--")):
            v = np.sort(df[col].dropna().to_numpy())
            ax.plot(v * 1e3, np.arange(1, len(v) + 1) / max(len(v), 1), style, label=label)
        ax.set_xlabel(f"{col.upper()} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{col.upper()} CDF, {policy}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
