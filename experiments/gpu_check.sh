#!/usr/bin/env bash
# The data plane's GPU checks in one run (for a lent CUDA machine whose python has torch and triton).
# Run from the repository root: bash experiments/gpu_check.sh [OUTDIR]   (at most DEADLINE=540 s)
#   1. the HF equality tests on CUDA (POLICYLAB_TEST_DEVICE=cuda, float32 both sides), the bf16 default
#      plane, the flash_attn-vs-torch test (skipped with its reason without flash-attn), and the triton
#      backend's and CUDA-graph runner's tests compiled on the GPU;
#   2. bench_dataplane.py on CUDA, each mode comparing the planes torch, triton and triton+graphs
#      against HF generate (tokens/s, identical greedy outputs, 32-decode and 512-prefill step times):
#      qwen2-0.5b-shaped bf16 64x(128 in, 128 out); tiny bf16; tiny float32; qwen2-0.5b bf16 with
#      varied output lengths (--output-spread 0.9); qwen2-0.5b float32;
#   3. one CLI replay on CUDA with dataplane.attention=triton (CUDA graphs on by default; logger=none);
#   4. bench_engine.py (CPU only) on that machine's CPU.
# Wheels of packages that machine lacks (hydra-core, omegaconf, antlr4, transformers) may be
# put in .whl/; they are installed to a private target first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-/tmp/gpu_check}}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}          # DEVICE=cpu BENCH_PLANES=torch BENCH_EXTRA="--requests 4 --output 4" CLI_EXTRA=...: a dry run
PLANES=${BENCH_PLANES:-torch,triton,triton+graphs}
DEADLINE=${DEADLINE:-540}       # seconds: each step's timeout is cut so that the whole run ends by then

run_for() {  # run_for SECONDS CMD...: CMD under a timeout of SECONDS, or of what is left before DEADLINE
  local left=$((DEADLINE - SECONDS))
  local t=$(( $1 < left ? $1 : left ))
  if [ "$t" -lt 10 ]; then echo "skipped, the ${DEADLINE} s are spent: ${*:2}"; return 0; fi
  timeout "$t" "${@:2}"
}
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
$PY -c "import triton; print('triton', triton.__version__)" 2>&1 | tail -1 | tee -a "$OUT/env.log"

echo "== 1. equality tests on $DEVICE"
run_for 200 env POLICYLAB_TEST_DEVICE=$DEVICE $PY -m pytest -o addopts="" -q -rs -p no:cacheprovider \
  tests/test_dataplane_model.py tests/test_dataplane_engine.py tests/test_policy_independence.py \
  tests/test_triton_attention.py tests/test_cuda_graphs.py \
  2>&1 | tee "$OUT/tests.log"

echo "== 2. bench_dataplane on $DEVICE (planes $PLANES)"
for args in "--model qwen2-0.5b" "--model tiny" "--model tiny --dtype float32" \
            "--model qwen2-0.5b --output-spread 0.9" "--model qwen2-0.5b --dtype float32"; do
  echo "-- $args"
  run_for 100 $PY experiments/bench_dataplane.py --device $DEVICE --planes $PLANES $args ${BENCH_EXTRA:-} 2>&1
done | tee "$OUT/bench.log"

echo "== 3. CLI replay on $DEVICE (attention ${CLI_ATTENTION:-triton})"
run_for 90 $PY -m policylab run dataplane.device=$DEVICE dataplane.attention=${CLI_ATTENTION:-triton} logger=none hydra.run.dir="$OUT/run" ${CLI_EXTRA:-} 2>&1 \
  | grep -v "it/s\]$" | tail -40 | tee "$OUT/cli.log"

echo "== 4. bench_engine on this machine's CPU (control plane only; for comparison with the dev box)"
run_for 90 $PY experiments/bench_engine.py ${ENGINE_EXTRA:-} 2>&1 | tee "$OUT/bench_engine.log"
