#!/usr/bin/env bash
# The data plane's GPU checks in one run (for a lent CUDA machine whose python has torch).
# Run from the repository root: bash experiments/gpu_check.sh [OUTDIR]
#   1. the HF equality tests on CUDA (POLICYLAB_TEST_DEVICE=cuda, float32 both sides), the
#      bf16 default plane and the flash_attn-vs-torch test (skipped with its reason without flash-attn);
#   2. bench_dataplane.py on CUDA: tiny (float32 and bf16) and qwen2-0.5b-shaped (bf16) random models;
#   3. one CLI replay on CUDA (the default trace, logger=none);
#   4. bench_engine.py (CPU only) on that machine's CPU.
# Wheels of packages that machine lacks (hydra-core, omegaconf, antlr4, transformers) may be
# put in .whl/; they are installed to a private target first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/gpu_check}}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}          # DEVICE=cpu BENCH_EXTRA="--requests 4 --output 4" CLI_EXTRA=...: a dry run
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi -L 2>&1 | tee "$OUT/env.log"
$PY -c "import torch, transformers, hydra; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
'transformers', transformers.__version__, 'hydra', hydra.__version__)" 2>&1 | tee -a "$OUT/env.log"
$PY -c "import flash_attn; print('flash_attn', flash_attn.__version__)" 2>&1 | tail -1 | tee -a "$OUT/env.log"

echo "== 1. equality tests on $DEVICE"
POLICYLAB_TEST_DEVICE=$DEVICE timeout 240 $PY -m pytest -o addopts="" -q -rs -p no:cacheprovider \
  tests/test_dataplane_model.py tests/test_dataplane_engine.py tests/test_policy_independence.py \
  2>&1 | tee "$OUT/tests.log"

echo "== 2. bench_dataplane on $DEVICE"
for args in "--model tiny --dtype float32" "--model tiny" "--model qwen2-0.5b"; do
  echo "-- $args"
  timeout 150 $PY experiments/bench_dataplane.py --device $DEVICE $args ${BENCH_EXTRA:-} 2>&1
done | tee "$OUT/bench.log"

echo "== 3. CLI replay on $DEVICE"
timeout 120 $PY -m policylab run dataplane.device=$DEVICE logger=none hydra.run.dir="$OUT/run" ${CLI_EXTRA:-} 2>&1 \
  | grep -v "it/s\]$" | tail -40 | tee "$OUT/cli.log"

echo "== 4. bench_engine on this machine's CPU (control plane only; for comparison with the dev box)"
timeout 150 $PY experiments/bench_engine.py ${ENGINE_EXTRA:-} 2>&1 | tee "$OUT/bench_engine.log"
