"""Orders kept across steps give exactly the order a full sort at each step would: `priority`
and `sjf` keep the waiting queue sorted by a time-free key and re-rank near-ties by the aged key."""
import pytest

from policies.priority import Priority
from policies.sjf import ShortestJobFirst
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.core.engine import Engine
from policylab.core.request import TraceRequest
from policylab.dataplane.sim import SimDataPlane


def checked(cls):
    class Checked(cls):
        """Compares the kept order with a fresh sort at every step (the whole order, not only the admitted head)."""
        compared = 0

        def admission_order(self, view):
            kept = list(super().admission_order(view))
            assert kept == sorted(view.waiting, key=lambda v: self.key(v, view.clock))
            Checked.compared += len(kept) > 1
            return kept
    return Checked


@pytest.mark.parametrize("cls, rate", [(Priority, 0.1), (Priority, 0.0), (ShortestJobFirst, 50.0)])
def test_kept_waiting_order_equals_a_fresh_sort(cls, rate):
    # whole-second arrivals and priorities one class apart: aged keys tie exactly, 10 s apart
    trace = [TraceRequest(float(i // 3 * 5), 40 + 30 * (i % 4), 3 + i % 5, priority=i % 3) for i in range(60)]
    policy = checked(cls)(aging_rate=rate, chunk_size=64)
    plane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"))
    result = Engine(trace, policy, plane, EngineConfig(block_size=8, num_blocks=40, max_num_seqs=4)).run()
    assert result.status == "complete", result.error
    assert type(policy).compared > 20
