#!/usr/bin/env bash
# Policies × loads × replicates on one trace (simulated data plane, joblib in parallel), then
# compare: the table grouped by load with mean ± 95% CI over replicates, metric-vs-load
# figure with CI bands, per-SLO-class and per-client tables (experiments/README.md).
#   experiments/sweep_load.sh [TRACE] [Hydra overrides...]
#   ONLY_POLICIES=prefill_first,chunked,slo_aware LOADS=0.8,0.95,1.1 REPLICATES=1,2,3 \
#       experiments/sweep_load.sh multitenant trace.repeat=3
# LOADS are trace.load values (fractions of the estimated capacity; LOAD_KEY=trace.rate_scale: multiples
# of the trace's own rate), REPLICATES trace.replicate values (block-bootstrap resamples of the trace;
# 0 is the trace as read). Default: every policy, loads 0.6,0.9,1.1, replicates 1,2,3.
# Output: multirun/load_<TRACE>_<time>/<n>_<policy>_<TRACE>/ (one run each) and .../compare/.
source "$(dirname "$0")/recipe.sh" load multitenant "$@"
POLICIES=${ONLY_POLICIES:-$POLICIES}

"$PY" -m policylab run -m "policy=$POLICIES" "trace=$TRACE" dataplane=sim "${LOAD_KEY:-trace.load}=${LOADS:-0.6,0.9,1.1}" \
    "trace.replicate=${REPLICATES:-1,2,3}" hydra/launcher=joblib progress=false "hydra.sweep.dir=$SWEEP" "${ARGS[@]}"
"$PY" -m policylab compare "$SWEEP" --log-wandb      # the pooled table and figures as a W&B run too
