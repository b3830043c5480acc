"""The replay freezes what is alive for the garbage collector as it goes (policylab.core.gc_freeze),
and leaves the collector as it found it: cyclic garbage made during the replay is still freed.

Each check runs in a fresh interpreter: what the collector holds (and what a full collection or a
scan of every object costs) then does not depend on the tests that ran before in this process."""
import gc
import subprocess
import sys
import weakref
from pathlib import Path

from policies.prefill_first import PrefillFirst
from policylab.core import gc_freeze as heap
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.sim import SimDataPlane
from policylab.core.engine import Engine
from policylab.core.request import TraceRequest as T


class Node:
    pass


class CycleMakingPolicy(PrefillFirst):
    """prefill_first that builds a reference cycle every step and notes the frozen count."""

    def __init__(self):
        super().__init__()
        self.frozen_counts, self.cycles = [], []

    def schedule(self, view):
        self.frozen_counts.append(gc.get_freeze_count())
        a, b = Node(), Node()
        a.other, b.other = b, a
        self.cycles.append(weakref.ref(a))
        return super().schedule(view)


def replay(policy):
    trace = [T(0.01 * i, 40, 6) for i in range(30)]
    plane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"))
    result = Engine(trace, policy, plane, EngineConfig(num_blocks=200)).run()
    assert result.status == "complete"


def in_fresh_interpreter(check: str) -> None:
    """Run `check` (a function of this module) in a new Python process; fail with its output."""
    code = f"import sys; sys.path.insert(0, 'tests'); import test_heap; test_heap.{check}()"
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_heap_is_frozen_as_requests_finish_and_unfrozen_after_the_run():
    in_fresh_interpreter("frozen_as_requests_finish")


def test_a_heap_the_caller_froze_stays_frozen():
    in_fresh_interpreter("caller_frozen_heap_stays")


def frozen_as_requests_finish():
    heap.FREEZE_EVERY = 5
    gc.collect()
    assert gc.get_freeze_count() == 0
    policy = CycleMakingPolicy()
    replay(policy)
    counts = policy.frozen_counts
    assert counts[0] > 0 and max(counts) > counts[0], "no freeze as requests finished"
    assert gc.get_freeze_count() == 0 and gc.isenabled()
    gc.collect()
    assert all(ref() is None for ref in policy.cycles), "cycles made during the replay leaked"


def caller_frozen_heap_stays():
    mine = [object()]                     # a container the collector tracks
    gc.freeze()
    try:
        replay(CycleMakingPolicy())
        assert gc.get_freeze_count() > 0
        assert all(o is not mine for o in gc.get_objects()), "the caller's frozen objects were unfrozen"
    finally:
        gc.unfreeze()
    assert any(o is mine for o in gc.get_objects())
