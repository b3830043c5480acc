"""`python -m policylab <command> dataplane=vllm ...` in a subprocess, as the vLLM CLI tests run it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_on_vllm(command: str, args: list, cwd: Path, out: Path, timeout: int) -> subprocess.CompletedProcess:
    """Run `command` with the checkout importable, vLLM's engine in process and results under `out`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "policylab", command, "dataplane=vllm", *args, "logger=none",
                           "progress=false", f"hydra.run.dir={out}"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
