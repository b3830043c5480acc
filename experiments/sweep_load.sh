#!/usr/bin/env bash
# Policies × loads × replicates on one trace (simulated data plane, joblib in parallel), then
# compare: the table grouped by load with mean ± 95% CI over replicates, metric-vs-load
# figure with CI bands, per-SLO-class and per-client tables (experiments/README.md).
#   experiments/sweep_load.sh [TRACE] [Hydra overrides...]
#   ONLY_POLICIES=prefill_first,chunked,slo_aware LOADS=12,24,32 REPLICATES=1,2,3 \
#       experiments/sweep_load.sh multitenant trace.repeat=10
# LOADS are trace.rate_scale values, REPLICATES trace.replicate values (block-bootstrap
# resamples of the trace; 0 is the trace as read). Default: every policy, loads 1,4,16, replicates 1,2,3.
# Output: multirun/load_<TRACE>_<time>/<n>_<policy>_<TRACE>/ (one run each) and .../compare/.
source "$(dirname "$0")/recipe.sh" load multitenant "$@"
POLICIES=${ONLY_POLICIES:-$POLICIES}

"$PY" -m policylab run -m "policy=$POLICIES" "trace=$TRACE" dataplane=sim "trace.rate_scale=${LOADS:-1,4,16}" \
    "trace.replicate=${REPLICATES:-1,2,3}" hydra/launcher=joblib progress=false "hydra.sweep.dir=$SWEEP" "${ARGS[@]}"
"$PY" -m policylab compare "$SWEEP" --log-wandb      # the pooled table and figures as a W&B run too
