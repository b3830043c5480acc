"""The real plane on a CPU that other processes share: intra-op threads, step timing, load.

On a machine with few cores, torch's default of one intra-op thread per core makes every
step wait for the slowest thread: with one busy neighbour on two cores, a step at two
threads takes two to three times as long as at one. So where cores are scarce the plane
runs one thread (`dataplane.threads` overrides it). And because a measured step time on a
shared CPU is a measurement of the neighbours as much as of the policy, CPU replays are
timed by the cost model of `hardware` unless asked otherwise (`dataplane.step_time`), and
a measured replay on a loaded machine says so.
"""
from __future__ import annotations

import os

SCARCE_CORES = 4          # at or below this many usable cores, one intra-op thread by default
STEP_TIMES = ("auto", "measured", "model")


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, as a container or taskset limits it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                      # macOS, Windows
        return os.cpu_count() or 1


def default_threads(cores: int | None = None) -> int | None:
    """Intra-op threads when `dataplane.threads` is null: 1 where cores are scarce, else None
    (torch's default)."""
    cores = usable_cores() if cores is None else cores
    return 1 if cores <= SCARCE_CORES else None


def resolve_step_time(step_time: str, device_type: str) -> str:
    """`auto`: the cost model on CPU (machine-independent numbers), measured on a GPU."""
    if step_time not in STEP_TIMES:
        raise ValueError(f"dataplane.step_time must be one of {STEP_TIMES}, got '{step_time}'")
    if step_time == "auto":
        return "model" if device_type == "cpu" else "measured"
    return step_time


def loaded_machine(threads: int, load: float | None = None, cores: int | None = None) -> str | None:
    """A warning when other runnable work wants the cores a measured CPU replay needs: the
    1-minute load average above the cores left after this replay's threads; None otherwise."""
    cores = usable_cores() if cores is None else cores
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):       # no load average on this platform
            return None
    if load <= cores - threads:
        return None
    return (f"the machine is loaded (load average {load:.1f} on {cores} cores, this replay runs "
            f"{threads} thread{'s' if threads != 1 else ''}): measured step times include the "
            "neighbours' contention, so the results depend on them; dataplane.step_time=model "
            "times the steps by the cost model of `hardware` instead")
