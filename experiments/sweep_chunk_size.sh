#!/usr/bin/env bash
# Grid sweep of `chunked`'s chunk_size on one trace (simulated data plane, joblib launcher),
# then the comparison table and CDFs. For a search instead of a grid, see the Optuna recipe
# in experiments/README.md.
#   experiments/sweep_chunk_size.sh [TRACE] [Hydra overrides...]
#   experiments/sweep_chunk_size.sh bursty trace.rate_scale=4
# Output: multirun/chunk_size_<TRACE>_<time>/<n>_chunked_<TRACE>/ and .../compare/.
source "$(dirname "$0")/recipe.sh" chunk_size bursty "$@"

"$PY" -m policylab run -m policy=chunked policy.chunk_size=64,128,256,512,1024,2048 "trace=$TRACE" \
    dataplane=sim hydra/launcher=joblib progress=false "hydra.sweep.dir=$SWEEP" "${ARGS[@]}"
"$PY" -m policylab compare "$SWEEP"
