"""While `python -m policylab` starts (numpy, torch, Hydra: seconds of imports), a stop signal
is noted instead of printing a traceback of whatever was being imported; `policylab/__main__.py`
then ends the program in one line. A second signal ends it at once."""
import os
import signal
import sys

STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
received: list = []


def _note(signum, frame):
    received.append(signum)
    if len(received) > 1:
        try:
            print(f"stopped ({signal.Signals(received[0]).name}) while starting: nothing was run or written",
                  file=sys.stderr, flush=True)
        finally:
            os._exit(128 + received[0])


for _sig in STOP_SIGNALS:
    signal.signal(_sig, _note)
