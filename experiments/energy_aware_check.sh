#!/usr/bin/env bash
# Energy saved at a fixed SLO attainment: chunked at the GPU's full clock, energy_aware (the clock
# lowered while every request has SLO slack) and chunked locked at the lowest clock, on the simulated
# Llama-3-8B/H100, multitenant (its own per-class SLOs) at two loads, 5 bootstrap replicates each;
# `compare` gives SLO attainment, TTFT/TPOT and joules per output token and per request meeting its
# SLOs, mean and 95 % CI.
#   experiments/energy_aware_check.sh [TRACE] [Hydra overrides...]
# Output: multirun/energy_aware_<TRACE>_<time>/ and its compare report.
source "$(dirname "$0")/recipe.sh" energy_aware multitenant "$@"

"$PY" -m policylab run -m policy=chunked,energy_aware "trace=$TRACE" trace.rate_scale=8,16 trace.repeat=3 \
    trace.replicate=1,2,3,4,5 dataplane=sim logger=none plots=false progress=false \
    "hydra.sweep.dir=$SWEEP/adaptive" "${ARGS[@]}"
"$PY" -m policylab run -m policy=chunked dataplane.gpu_clock_mhz=990 "trace=$TRACE" trace.rate_scale=8,16 \
    trace.repeat=3 trace.replicate=1,2,3,4,5 dataplane=sim logger=none plots=false progress=false \
    "hydra.sweep.dir=$SWEEP/locked" "${ARGS[@]}"
"$PY" -m policylab compare "$SWEEP"
