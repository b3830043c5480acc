"""`view.sampled` and `view.arrived` tell a policy what changed since its previous
schedule() call, each fact exactly once, so incremental policy state stays exact."""
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.core.contract import StepPlan
from policylab.core.engine import Engine
from policylab.core.policy import Policy
from policylab.core.request import TraceRequest
from policylab.dataplane.sim import SimDataPlane


class Recorder(Policy):
    """Admits one waiting request per step (whole prompt), decodes every running one."""

    def __init__(self):
        super().__init__("recorder")
        self.seen = []

    def schedule(self, view):
        self.seen.append((view.step, tuple(view.sampled), tuple(view.arrived),
                          {v.req_id: v.num_output_tokens for v in view.running}))
        plan = StepPlan({rid: 1 for rid in view.decoding})
        if view.waiting:
            plan.num_scheduled_tokens[view.waiting[0].req_id] = view.waiting[0].remaining_tokens
        return plan


def test_sampled_and_arrived_name_each_change_once():
    trace = [TraceRequest(0.0, 8, 3), TraceRequest(0.0, 8, 2), TraceRequest(5.0, 8, 2)]
    policy = Recorder()
    plane = SimDataPlane(ModelConfig(), HardwareConfig(), DataplaneConfig(kind="sim"))
    result = Engine(trace, policy, plane, EngineConfig(block_size=4, num_blocks=40)).run()
    assert result.status == "complete"
    arrived = [rid for _, _, a, _ in policy.seen for rid in a]
    assert arrived == [0, 1, 2]                          # every arrival told once, in order
    assert policy.seen[0][1] == () and policy.seen[0][2] == (0, 1)
    for (_, _, _, before), (_, sampled, _, after) in zip(policy.seen, policy.seen[1:]):
        grew = {rid for rid, n in after.items() if n > before.get(rid, 0)}
        assert grew <= set(sampled)                      # each running request's new token is told
        assert len(sampled) == len(set(sampled))
    told = sum(len(s) for _, s, _, _ in policy.seen)
    assert told <= sum(len(r.output_ids) for r in result.requests)   # finishing tokens may go untold
