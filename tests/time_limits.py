"""A per-block time limit for the tests that drive vLLM in process (vLLM's own threads and C
code can outlast pytest-timeout's thread method; SIGALRM interrupts the main thread)."""
from __future__ import annotations

import signal
from contextlib import contextmanager


@contextmanager
def time_limit(seconds: int):
    """Fail instead of hanging (SIGALRM: the main thread, POSIX)."""
    def expire(signum, frame):
        raise TimeoutError(f"test ran over its {seconds} s limit")
    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
