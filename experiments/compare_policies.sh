#!/usr/bin/env bash
# Replay one trace under every policy in configs/policy/ (simulated data plane, runs in
# parallel with the joblib launcher), then compare them side by side.
#   experiments/compare_policies.sh [TRACE] [Hydra overrides...]
#   experiments/compare_policies.sh bursty trace.rate_scale=2 logger=none
# Output: multirun/compare_<TRACE>_<time>/<n>_<policy>_<TRACE>/ (one run each) and .../compare/.
source "$(dirname "$0")/recipe.sh" compare bursty "$@"

"$PY" -m policylab run -m "policy=$POLICIES" "trace=$TRACE" dataplane=sim hydra/launcher=joblib \
    progress=false "hydra.sweep.dir=$SWEEP" "${ARGS[@]}"
"$PY" -m policylab compare "$SWEEP"
