"""Sim-vs-real fidelity: replay one trace on the real data plane and on the calibrated sim.

Sweeps run on the sim because it is thousands of times faster; its numbers are worth
something only if it predicts the real plane. This job replays the same trace, policy
and KV size on both and reports the relative error of each latency metric next to the real
plane's own run-to-run spread (a second real replay), the floor below which no sim error means
anything. Each replay's result files are kept (`real/`, `real_again/`, `sim/`). On a shared
CPU measure with `dataplane.timer=cpu` (and the same timer as the calibration's).
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pandas as pd

from policylab.analysis.results import write_results
from policylab.apps.settings import plain_config, result_settings
from policylab.apps.calibrate import calibrate
from policylab.apps.config import RunConfig, typed_config
from policylab.apps.offered_load import resolve_load
from policylab.apps.jobs import build_engine, dataplane_of, measuring, replay
from policylab.dataplane.fitted import load_calibration
from policylab.apps.fidelity_report import _get, sim_and_report

def fidelity(cfg: RunConfig, run_dir: Path) -> pd.DataFrame:
    cfg = resolve_load(typed_config(cfg))[0]
    if cfg.dataplane.kind == "vllm":
        from policylab.apps.fidelity_vllm import fidelity_vllm
        return fidelity_vllm(cfg, run_dir)
    if cfg.dataplane.kind != "torch":
        raise ValueError("fidelity compares against a real data plane: use dataplane=torch or dataplane=vllm")
    cfg = measuring(cfg, "fidelity")
    path = cfg.dataplane.calibration
    real_plane = dataplane_of(cfg)
    calib = load_calibration(path) if path else calibrate(real_plane, cfg.engine, run_dir, cfg.seed)
    path = path or str(run_dir / "calibration.json")
    measured_on, timing = calib.meta.get("measured_on") or {}, real_plane.describe_cost_model()
    if measured_on.get("timer") != timing["timer"]:
        print(f"warning: the calibration was measured with timer={measured_on.get('timer')}, this replay "
              f"with timer={timing['timer']}: the sim predicts another clock", file=sys.stderr)
    (real_req, real_sum), (_, again_sum) = real_replays(cfg, real_plane, timing, run_dir)
    num_blocks = cfg.engine.num_blocks or real_plane.num_kv_blocks(cfg.engine.block_size)
    return sim_and_report(cfg, run_dir, path, calib, dataclasses.replace(cfg.engine, num_blocks=num_blocks),
                          (real_req, real_sum), again_sum)


SAME = (("policy", "name"), ("trace", "name"), ("trace", "max_requests"), ("model", "name"), ("seed",),
        ("dataplane", "timer"), ("dataplane", "timer_repeats"), ("engine", "max_num_batched_tokens"))


def real_replays(cfg: RunConfig, real_plane, timing: dict, run_dir: Path) -> list:
    """(requests, summary) of two real replays of the config: the run directories named by
    `fidelity.real_runs` (replays of the same config by `policylab run`, checked field by field),
    else two fresh replays written to run_dir/real and run_dir/real_again."""
    dirs = [Path(d) for d in cfg.fidelity.real_runs]
    if not dirs:
        dirs = [run_dir / "real", run_dir / "real_again"]
        for d in dirs:          # the same replay twice: the second measures the plane's own noise
            write_results(d, replay(build_engine(cfg, real_plane), cfg.progress), result_settings(cfg), {"cost_model": timing})
    elif len(dirs) != 2:
        raise ValueError(f"fidelity.real_runs needs two run directories of the same config, got {len(dirs)}")
    want = plain_config(cfg)
    out = []
    for d in dirs:
        try:
            summary = json.loads((d / "summary.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"fidelity.real_runs: {d / 'summary.json'} unreadable ({e})") from None
        for key in SAME:
            have, need = _get(summary.get("config"), key), _get(want, key)
            if have != need:
                raise ValueError(f"fidelity.real_runs: {d} has {'.'.join(key)}={have}, this config {need}")
        out.append((pd.read_parquet(d / "requests.parquet"), summary))
    return out
