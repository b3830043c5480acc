#!/usr/bin/env bash
# What an FP8 KV cache does to a policy ranking where KV binds: chunked against prefill_first on the
# simulated Llama-3-8B/H100 with a tight memory budget (gpu_memory_utilization 0.261: 1.5 GB of KV at
# BF16 after the weights and the vllm engine's 3.27 GB), the KV cache in BF16 and in FP8 (twice the
# blocks in the same memory), and BF16 with the memory FP8's blocks take (0.2804: the same blocks,
# BF16's attention reads) to tell capacity from speed; 5 bootstrap replicates of multitenant x16 (x3 repeated), mean and 95 % CI by `compare`.
#   experiments/fp8_kv_ranking.sh [TRACE] [Hydra overrides...]
# Output: multirun/fp8_kv_<TRACE>_<time>/ and its compare report.
source "$(dirname "$0")/recipe.sh" fp8_kv multitenant "$@"

"$PY" -m policylab run -m policy=chunked,prefill_first kv_dtype=auto,fp8 \
    dataplane.gpu_memory_utilization=0.261,0.2804 "trace=$TRACE" trace.rate_scale=16 trace.repeat=3 \
    trace.replicate=1,2,3,4,5 dataplane=sim logger=none plots=false progress=false \
    "hydra.sweep.dir=$SWEEP" "${ARGS[@]}"
"$PY" -m policylab compare "$SWEEP"
