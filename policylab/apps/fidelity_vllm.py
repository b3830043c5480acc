"""`calibrate` and `fidelity` with vLLM as the real side (`dataplane=vllm`).

vLLM runs its own model runner, so there is no grid of made-up batches to time: the simulator
is fitted on the steps vLLM really ran (every step of a replay of the trace under the policy:
its query and context lengths, and the time from `schedule()` to `update_from_output()`).
`fidelity` then replays the trace twice on vLLM (the second measures vLLM's own run-to-run
spread) and once on the sim with that fit, with vLLM's KV size, and reports per-metric error.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from policylab.analysis.results import summarize_run, write_results
from policylab.apps.calibrate import fit
from policylab.apps.config import RunConfig
from policylab.apps.settings import result_settings
from policylab.dataplane.fitted import FEATURES, Calibration, batch_features, load_calibration
from policylab.traces import load_trace


def _replay(cfg: RunConfig, batch_log=None):
    from policylab.apps.run_vllm import vllm_setup
    from policylab.integrations.vllm.replay import replay_trace
    setup = vllm_setup(cfg)
    trace = load_trace(cfg.trace, seed=cfg.seed)
    result = replay_trace(list(trace), dict(cfg.policy), setup, cfg.trace.prefix_block_tokens, batch_log=batch_log)
    if result.partial:
        raise RuntimeError(f"vLLM replay stopped early: {result.error}")
    return result, setup


def steps_profile(batch_log: list) -> pd.DataFrame:
    rows = []
    for q, ctx, sampled, seconds in batch_log:
        f = batch_features(np.asarray(q, float), np.asarray(ctx, float), sampled)
        rows.append({"query_lens": q, "context_lens": ctx, **dict(zip(FEATURES, f)), "time": seconds})
    return pd.DataFrame(rows)


def calibrate_vllm(cfg: RunConfig, run_dir: Path) -> Calibration:
    """Fit the sim's cost model on every step of a vLLM replay of the trace; save profile.csv and
    calibration.json in run_dir."""
    import vllm
    log: list = []
    result, setup = _replay(cfg, log)
    write_results(run_dir / "calibration_replay", result, result_settings(cfg), {"vllm": {"version": vllm.__version__}})
    df = steps_profile(log)
    df.to_csv(run_dir / "profile.csv", index=False)
    calibration, mape = fit(df, seed=cfg.seed)
    calibration.meta["measured_on"] = {"kind": "vllm", "version": vllm.__version__, "model_dir": setup.model_dir,
                                       "timer": "wall"}
    calibration.meta["num_blocks"] = result.num_blocks
    calibration.save(run_dir / "calibration.json")
    print(f"calibration: {len(df)} vLLM steps, held-out MAPE {mape:.1%} "
          f"(train {calibration.meta['train_mape']:.1%}) -> {run_dir / 'calibration.json'}")
    return calibration


def fidelity_vllm(cfg: RunConfig, run_dir: Path) -> pd.DataFrame:
    import vllm
    path = cfg.dataplane.calibration
    calib = load_calibration(path) if path else calibrate_vllm(cfg, run_dir)
    path = path or str(run_dir / "calibration.json")
    real_runs = []
    for name in ("real", "real_again"):
        result, _ = _replay(cfg)
        write_results(run_dir / name, result, result_settings(cfg), {"vllm": {"version": vllm.__version__}})
        real_runs.append((result, summarize_run(result, result_settings(cfg))))
    from policylab.apps.fidelity_report import sim_and_report
    engine_cfg = dataclasses.replace(cfg.engine, num_blocks=real_runs[0][0].num_blocks, clock="virtual")
    (real_req, _, real_sum), (_, _, again_sum) = real_runs[0][1], real_runs[1][1]
    return sim_and_report(cfg, run_dir, path, calib, engine_cfg, (real_req, real_sum), again_sum, "vLLM")
