#!/usr/bin/env bash
# Capacity of every policy on one trace: the highest arrival rate (req/s) at which SLO
# attainment stays >= the target, by bisection on trace.rate_scale (simulated data plane,
# policies in parallel with the joblib launcher). Ends with a table sorted by capacity.
#   experiments/capacity.sh [TRACE] [Hydra overrides...]
#   experiments/capacity.sh poisson slo.ttft=0.5 slo.tpot=0.05 target=0.9
# Output: multirun/capacity_<TRACE>_<time>/<n>_<policy>_<TRACE>/capacity.{json,csv,png}
#         and capacity_summary.csv beside them.
source "$(dirname "$0")/recipe.sh" capacity poisson "$@"

"$PY" -m policylab capacity -m "policy=$POLICIES" "trace=$TRACE" dataplane=sim \
    hydra/launcher=joblib "hydra.sweep.dir=$SWEEP" "${ARGS[@]}"
"$PY" - "$SWEEP" <<'PYTHON'
import json, sys
from pathlib import Path
import pandas as pd
rows = [{"policy": r["policy"], "capacity (req/s)": r["rate"], "rate_scale": r["rate_scale"],
         "status": r["status"], "dir": str(p.parent)}
        for p in Path(sys.argv[1]).glob("*/capacity.json") for r in [json.loads(p.read_text())]]
table = pd.DataFrame(rows).sort_values("capacity (req/s)", ascending=False, na_position="last")
table.to_csv(Path(sys.argv[1]) / "capacity_summary.csv", index=False)
print(table.to_string(index=False))
PYTHON
"$PY" -m policylab compare "$SWEEP"      # every policy's attainment-vs-rate curve in one figure
