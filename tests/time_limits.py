"""A per-block time limit for the tests that drive vLLM in process: a block gets a shorter limit
than its test's, and the test's own (pytest-timeout's signal method: the same SIGALRM timer)
keeps running around it, with the time it had left."""
from __future__ import annotations

import signal
import time
from contextlib import contextmanager


@contextmanager
def time_limit(seconds: float):
    """Fail with TimeoutError after `seconds` (SIGALRM: the main thread, POSIX). An alarm already
    armed that would go off first is left to go off; one that would go off later gets back what
    it had left when the block ends."""
    outer_left = signal.getitimer(signal.ITIMER_REAL)[0]
    if 0 < outer_left <= seconds:          # the test's own limit comes first: it stays in charge
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(f"test ran over its {seconds:g} s limit")

    start = time.monotonic()
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if outer_left > 0:
            signal.setitimer(signal.ITIMER_REAL, max(outer_left - (time.monotonic() - start), 1e-3))
