"""vLLM's OpenAI server on loopback, in a session of its own: started, waited for until `/health`
answers, and always torn down with every process it started (the serving test, and
experiments/cpu_vllm_e2e.py)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(cmd: list, port: int, log: Path, seconds: float, env: dict | None = None,
                 cwd: Path | None = None) -> subprocess.Popen:
    """`cmd` (a vLLM server on `port`) started with its output in `log`, returned once healthy; one
    that exits or stays unhealthy for `seconds` is stopped and raises, with the log's tail."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(1)
    stop(proc)
    raise RuntimeError(f"vllm serve not healthy after {seconds} s:\n{log.read_text()[-4000:]}")


def stop(proc: subprocess.Popen) -> None:
    """The server and every process it started (its own session) are torn down."""
    for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
