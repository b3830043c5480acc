"""The run's energy metrics (summary.json `energy`), from the data plane's energy meter
(policylab.dataplane.energy) and the run's own request table and makespan.

Busy energy is what the meter charged the steps; idle energy the GPUs' idle power over the rest
of the makespan (a GPU draws idle power between steps too, e.g. waiting for arrivals). Per output
token and per request that met its SLOs (energy per unit of goodput) divide the total; the
per-request distribution is each finished request's share of the steps it ran in.
"""
from __future__ import annotations

import math

import pandas as pd

from policylab.analysis.metrics import distribution


def energy_section(report: dict, requests: pd.DataFrame, summary: dict) -> dict:
    """`energy` of summary.json from a meter's report (EnergyMeter.report, merged over replicas)."""
    makespan = summary.get("makespan")
    makespan = makespan if isinstance(makespan, (int, float)) and math.isfinite(makespan) else 0.0
    gpus, busy = report["gpus"], report["busy_energy_j"]
    idle_s = max(0.0, gpus * makespan - report["busy_gpu_s"])
    idle = report["idle_power_w"] * idle_s
    total = busy + idle
    finished = requests["status"].to_numpy() == "finished"
    per_request = report["per_request_j"].at(requests["req_id"].to_numpy()[finished])
    generated = int(requests["generated_tokens"].sum())
    good = int(requests["slo_met"].sum())
    return {"total_j": total, "busy_j": busy, "idle_j": idle,
            "mean_power_w": total / (gpus * makespan) if makespan > 0 and gpus else None,
            "per_output_token_j": total / generated if generated else None,
            "per_request_j": distribution(per_request),
            "per_good_request_j": total / good if good else None,
            "throttled_share": (report.get("throttled_time_s", 0.0) / report["busy_time_s"]
                                if report["busy_time_s"] else None),
            "gpus": gpus, "gpu_clock_mhz": report.get("gpu_clock_mhz")}
