"""Does a policy schedule inside vLLM exactly as in policylab's own replay? Step by step.

`compare_replays` replays one trace twice with the same policy config: in policylab's engine
on the simulated data plane, and in vLLM's real scheduler (`PolicyScheduler`, bare: fabricated
model outputs) with every step lasting what the simulator said it lasted, so both sides see
the same clock. It returns the first step where what vLLM scheduled (tokens per request, in
batch order, and preemptions) differs from policylab's, with both sides' steps, or None.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from policylab.core.config import EngineConfig, HardwareConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.core.engine import Engine
from policylab.core.policy import Policy
from policylab.integrations.vllm.policy_config import load_policy


class Recording(Policy):
    """A policy that notes every plan it returns (tokens in order, preemptions, rejections)."""

    def __init__(self, inner: Policy):
        super().__init__(getattr(inner, "name", type(inner).__name__))
        self.inner, self.plans = inner, []

    def schedule(self, view):
        plan = self.inner.schedule(view)
        self.plans.append((view.clock, list(plan.num_scheduled_tokens.items()), list(plan.preempt),
                           dict(plan.reject)))
        return plan

    def on_finished(self, req_view) -> None:
        self.inner.on_finished(req_view)


@dataclass
class Divergence:
    step: int
    policylab: Optional[tuple]       # (clock, [(req, tokens)...], preempted)
    vllm: Optional[tuple]
    steps: tuple                     # (policylab steps, vLLM steps)

    def __str__(self) -> str:
        return (f"first divergent step {self.step} of {self.steps[0]} (policylab) / {self.steps[1]} (vLLM):\n"
                f"  policylab: {self.policylab}\n  vLLM:      {self.vllm}")


def sim_replay(trace: list, policy_spec, cfg: EngineConfig, seed: int = 0):
    """policylab's replay on the sim plane: (per executed step (clock, tokens, preempted), durations)."""
    from policylab.dataplane.sim import SimDataPlane
    from policylab.integrations.vllm.tiny_model import tiny_shape
    policy = Recording(load_policy(policy_spec))
    plane = SimDataPlane(tiny_shape(), HardwareConfig(), DataplaneConfig(kind="sim"), seed)
    engine = Engine(trace, policy, plane, replace(cfg, check_invariants=True), seed=seed)
    result = engine.run()
    if result.status != "complete":
        raise AssertionError(f"policylab's own replay did not complete: {result.error}")
    executed = [(c, s, p) for c, s, p, _ in policy.plans if s]
    return executed, list(engine.steps["duration"]), plane.vocab_size


def vllm_replay(trace: list, policy_spec, cfg: EngineConfig, durations: list, vocab_size: int, seed: int = 0):
    """The same trace through vLLM's scheduler under PolicyScheduler, steps lasting `durations`."""
    from policylab.integrations.vllm.bare import bare_scheduler, run_bare, vllm_requests
    from policylab.integrations.vllm.scheduler import PolicyScheduler
    box = [0.0]
    cls = PolicyScheduler.with_policy(load_policy(policy_spec), clock=lambda: box[0])
    scheduler = bare_scheduler(cls, cfg, cfg.num_blocks)
    requests = vllm_requests(trace, cfg, vocab_size, seed)
    extra = durations[-1] if durations else 0.01
    run = run_bare(scheduler, requests, lambda k, _: durations[k] if k < len(durations) else extra, clock=box,
                   max_steps=len(durations) + 50)
    return [(s.clock, list(s.num_scheduled_tokens.items()), list(s.preempted)) for s in run.steps], run


def compare_replays(trace: list, policy_spec, cfg: EngineConfig, seed: int = 0) -> Optional[Divergence]:
    ours, durations, vocab = sim_replay(trace, policy_spec, cfg, seed)
    theirs, run = vllm_replay(trace, policy_spec, cfg, durations, vocab, seed)
    for k in range(max(len(ours), len(theirs))):
        a = ours[k] if k < len(ours) else None
        b = theirs[k] if k < len(theirs) else None
        if a is None or b is None or a[1] != b[1] or sorted(a[2]) != sorted(b[2]) or abs(a[0] - b[0]) > 1e-9:
            return Divergence(k, a, b, (len(ours), len(theirs)))
    if run.unfinished:
        return Divergence(len(theirs), None, ("unfinished", run.unfinished), (len(ours), len(theirs)))
    return None
