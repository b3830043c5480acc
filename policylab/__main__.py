"""`python -m policylab`: a stop signal while the program starts (importing numpy, torch, Hydra)
ends it in one line, not a traceback (policylab/_startup.py); from then on a stop signal is
noted and each job says what it wrote (policylab/apps/signals.py)."""
import signal
import sys

from policylab import _startup
from policylab.apps.cli import main
from policylab.apps.signals import keep_stop_signals

keep_stop_signals()
if _startup.received:
    print(f"stopped ({signal.Signals(_startup.received[0]).name}) while starting: nothing was run or written",
          file=sys.stderr)
    raise SystemExit(128 + _startup.received[0])
main()
