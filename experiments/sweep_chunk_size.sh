#!/usr/bin/env bash
# Grid sweep of `chunked`'s chunk_size on one trace (simulated data plane, joblib launcher),
# then the comparison table and CDFs. For a search instead of a grid, see the Optuna recipe
# in experiments/README.md.
#   experiments/sweep_chunk_size.sh [TRACE] [Hydra overrides...]
#   experiments/sweep_chunk_size.sh bursty trace.rate_scale=4
# Output: multirun/chunk_size_<TRACE>_<time>/<n>_chunked_<TRACE>/ and .../compare/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}
TRACE=${1:-bursty}
shift $(( $# > 0 ? 1 : 0 ))
SWEEP=multirun/chunk_size_${TRACE}_$(date +%Y-%m-%d_%H-%M-%S)

"$PY" -m policylab run -m policy=chunked policy.chunk_size=64,128,256,512,1024,2048 "trace=$TRACE" \
    dataplane=sim hydra/launcher=joblib progress=false "hydra.sweep.dir=$SWEEP" "$@"
"$PY" -m policylab compare "$SWEEP"
