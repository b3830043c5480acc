# Shared setup of the sweep recipes (sourced, not run):  source recipe.sh NAME DEFAULT_TRACE "$@"
# Runs from the repository root and sets PY (its venv's python unless $PYTHON), TRACE (the recipe's
# first argument, else DEFAULT_TRACE), ARGS (the Hydra overrides after it), POLICIES (every
# configs/policy/*.yaml, comma-separated) and SWEEP (a fresh multirun/NAME_TRACE_time directory).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}
TRACE=${3:-$2}
ARGS=("${@:4}")
POLICIES=$(ls configs/policy/*.yaml | xargs -n1 basename | sed 's/\.yaml$//' | paste -sd, -)
SWEEP=multirun/${1}_${TRACE}_$(date +%Y-%m-%d_%H-%M-%S)
