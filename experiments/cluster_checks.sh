#!/usr/bin/env bash
# The cluster research checks, sim data plane, one command each; each ends
# with a compare table. Run from the repository root; outputs under multirun/cluster_checks/.
#   experiments/cluster_checks.sh [prefix|pd|pools|capacity|all]
# prefix: Mooncake's prefix-heavy trace on 4 replicas, round_robin vs prefix_affinity
#         (the trace at its own rate, ~3.9 req/s over 4 replicas), prefix hit rate and TTFT.
# pd:     a long-prompt trace (generated: prompts mean ~2.8k, outputs ~190, 16 req/s) under
#         TTFT <= 1.5 s and TPOT <= 60 ms: 2 prefill + 2 decode replicas vs 4 colocated
#         prefill_first replicas (least_loaded), goodput per GPU and TPOT p99.
# pools:  2 prefill + 2 decode replicas on the same trace, the prefill pool running prefill_first,
#         the decode pool (cluster.decode_policy) prefill_first, decode_first (drained batches),
#         decode_first admitting into free slots, or chunked: at 16 req/s under pd's SLOs, and
#         at P/D's capacity under capacity's (first 800 requests, rate_scale 1.76: 29.5 req/s, TPOT <= 30 ms).
# capacity: the same two configurations through `capacity` (cluster.* overrides), TPOT <= 30 ms,
#         the trace's first 800 requests, rate_scale bisected in [1.2, 2] (16 req/s x scale).
set -euo pipefail
PY=${PY:-python}
OUT=multirun/cluster_checks
WHAT=${1:-all}
COMMON=(dataplane=sim logger=none progress=false)
long_prompt_trace() {
  mkdir -p $OUT
  [[ -f $OUT/long_prompt.jsonl ]] || "$PY" -m policylab trace generate --kind poisson -n 2000 --rate 16 --seed 0 \
      -o $OUT/long_prompt.jsonl --prompt-len lognormal:mean=3000,p90=6000,max=7500 \
      --output-len lognormal:mean=200,p90=400,max=600
}
if [[ $WHAT == prefix || $WHAT == all ]]; then
  "$PY" -m policylab run -m router=round_robin,prefix_affinity cluster.replicas=4 trace=mooncake_synthetic \
      "${COMMON[@]}" \
      hydra.sweep.dir=$OUT/prefix
  "$PY" -m policylab compare $OUT/prefix
fi
if [[ $WHAT == pd || $WHAT == all ]]; then
  long_prompt_trace
  SLO=(slo.ttft=1.5 slo.tpot=0.06 trace=file trace.path=$OUT/long_prompt.jsonl "${COMMON[@]}")
  "$PY" -m policylab run cluster.replicas=4 router=least_loaded "${SLO[@]}" hydra.run.dir=$OUT/pd/colocated
  "$PY" -m policylab run cluster.prefill_replicas=2 cluster.decode_replicas=2 router=least_loaded \
      decode_router=least_loaded "${SLO[@]}" hydra.run.dir=$OUT/pd/disaggregated
  "$PY" -m policylab compare $OUT/pd
fi
if [[ $WHAT == pools || $WHAT == all ]]; then
  long_prompt_trace
  POOLS=(-m cluster.prefill_replicas=2 cluster.decode_replicas=2 router=least_loaded decode_router=least_loaded
         policy=prefill_first trace=file trace.path=$OUT/long_prompt.jsonl slo.ttft=1.5 "${COMMON[@]}"
         "cluster.decode_policy=prefill_first,decode_first,{name:decode_first,admit_into_free_slots:true},chunked")
  "$PY" -m policylab run "${POOLS[@]}" slo.tpot=0.06 hydra.sweep.dir=$OUT/pools/16rps
  "$PY" -m policylab compare $OUT/pools/16rps
  "$PY" -m policylab run "${POOLS[@]}" slo.tpot=0.03 trace.max_requests=800 trace.rate_scale=1.76 \
      hydra.sweep.dir=$OUT/pools/capacity
  "$PY" -m policylab compare $OUT/pools/capacity
fi
if [[ $WHAT == capacity || $WHAT == all ]]; then
  long_prompt_trace
  CAP=(trace=file trace.path=$OUT/long_prompt.jsonl trace.max_requests=800 dataplane=sim slo.ttft=1.5 slo.tpot=0.03
       target=0.9 lo=1.2 hi=2.0 iters=4 widen=1 router=least_loaded)
  "$PY" -m policylab capacity "${CAP[@]}" cluster.replicas=4 hydra.run.dir=$OUT/capacity/colocated
  "$PY" -m policylab capacity "${CAP[@]}" cluster.prefill_replicas=2 cluster.decode_replicas=2 \
      decode_router=least_loaded hydra.run.dir=$OUT/capacity/disaggregated
fi
