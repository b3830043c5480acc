"""The fidelity report: the calibrated sim's replay and its error next to the real side's own
run-to-run spread, as a table, a markdown page and CDF figures (shared by the torch and vLLM
real sides)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from policylab.analysis.results import summarize_run, write_results
from policylab.apps.config import RunConfig
from policylab.apps.jobs import build_policy, replay
from policylab.apps.settings import result_settings
from policylab.core.engine import Engine
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.fitted import Calibration
from policylab.dataplane.sim import SimDataPlane
from policylab.traces import load_trace

METRICS = ("ttft", "tpot", "itl", "e2e")
STATS = ("mean", "p50", "p99")
HEADLINE = ("ttft p50", "ttft p99", "tpot p50", "tpot p99", "e2e mean")   # the fidelity targets


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


def _get(tree, key: tuple):
    for k in key:
        tree = tree.get(k) if isinstance(tree, dict) else None
    return tree


def headline(table: pd.DataFrame) -> str:
    """The worst sim error over the headline metrics, next to the worst real run-to-run spread."""
    rows = table[table["metric"].isin(HEADLINE)]
    worst = rows.loc[rows["rel_error"].idxmax()]
    return (f"sim error on {', '.join(HEADLINE)}: at most {worst.rel_error:.1%} ({worst.metric}); "
            f"real run-to-run spread: at most {rows['real_noise'].max():.1%}")


def markdown(table: pd.DataFrame, cfg, calib: Calibration) -> str:
    lines = [f"# Sim vs real: policy {cfg.policy.name}, trace {cfg.trace.name}, model {cfg.model.name}", "",
             f"Calibration held-out MAPE: {calib.meta.get('heldout_mape', float('nan')):.1%}. "
             "`real noise` is how far a second real replay of the same config lands from the first: "
             "sim errors below it are within what the real plane itself reproduces.", "",
             "| metric | real (s) | sim (s) | sim error | real noise |", "|---|---|---|---|---|"]
    lines += [f"| {r.metric} | {r.real:.4f} | {r.sim:.4f} | {r.rel_error:.1%} | {r.real_noise:.1%} |"
              for r in table.itertuples()]
    lines += ["", headline(table) + "."]
    return "\n".join(lines) + "\n"


def plot_cdfs(real: pd.DataFrame, sim: pd.DataFrame, path: Path, policy: str) -> None:
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


def sim_and_report(cfg: RunConfig, run_dir: Path, path: str, calib, engine_cfg, real: tuple, again_sum: dict,
                   real_name: str = "real") -> pd.DataFrame:
    """The calibrated sim's replay of the trace (`sim/`) and the report of its error against the
    real replays (`real`: its requests and summary; `again_sum`: the second real replay's summary):
    fidelity.csv, fidelity.md, fidelity_cdf.png and the table on the terminal."""
    real_req, real_sum = real
    sim_plane = SimDataPlane(cfg.model, cfg.hardware, DataplaneConfig(kind="sim", calibration=path), cfg.seed)
    sim_engine = Engine(load_trace(cfg.trace, seed=cfg.seed), build_policy(cfg.policy), sim_plane,
                        engine_cfg, seed=cfg.seed, prefix_block_tokens=cfg.trace.prefix_block_tokens)
    sim = replay(sim_engine, cfg.progress)
    write_results(run_dir / "sim", sim, result_settings(cfg), {"cost_model": sim_plane.describe_cost_model()})
    sim_req, _, sim_sum = summarize_run(sim, result_settings(cfg))
    table = error_table(real_sum, sim_sum, again_sum)
    table.to_csv(run_dir / "fidelity.csv", index=False)
    md = markdown(table, cfg, calib).replace("Sim vs real", f"Sim vs {real_name}", 1)
    (run_dir / "fidelity.md").write_text(md)
    plot_cdfs(real_req, sim_req, run_dir / "fidelity_cdf.png", sim_engine.policy_name)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(headline(table))
    print(f"fidelity report: {run_dir / 'fidelity.md'}")
    return table
