#!/usr/bin/env bash
# Replay one trace under every policy in configs/policy/ (simulated data plane, runs in
# parallel with the joblib launcher), then compare them side by side.
#   experiments/compare_policies.sh [TRACE] [Hydra overrides...]
#   experiments/compare_policies.sh bursty trace.rate_scale=2 logger=none
# Output: multirun/compare_<TRACE>_<time>/<n>_<policy>_<TRACE>/ (one run each) and .../compare/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}
TRACE=${1:-bursty}
shift $(( $# > 0 ? 1 : 0 ))
POLICIES=$(ls configs/policy/*.yaml | xargs -n1 basename | sed 's/\.yaml$//' | paste -sd, -)
SWEEP=multirun/compare_${TRACE}_$(date +%Y-%m-%d_%H-%M-%S)

"$PY" -m policylab run -m "policy=$POLICIES" "trace=$TRACE" dataplane=sim hydra/launcher=joblib \
    progress=false "hydra.sweep.dir=$SWEEP" "$@"
"$PY" -m policylab compare "$SWEEP"
