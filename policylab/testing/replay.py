"""Replay a trace on the sim data plane and keep what the policy decided at every step.

For policy unit tests and behaviour comparisons: `replay(policy, trace, cfg)` returns the
RunResult and one `PlanRecord` per schedule() call (what was waiting and running, which
running requests were decoding, and the plan).
"""
from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass

from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.dataplane.sim import SimDataPlane
from policylab.core.engine import Engine
from policylab.core.result import RunResult
from policylab.testing.loader import CONFIG_DIR, policy_factory


@dataclass(frozen=True)
class PlanRecord:
    clock: float
    step: int
    running: dict          # req_id -> is_decode, in running order
    waiting: tuple         # req_ids in queue order
    num_free_blocks: int
    plan: object           # a copy of the StepPlan


class _Recorder:
    def __init__(self, inner, records: list):
        self.inner, self.records = inner, records
        self.name = getattr(inner, "name", type(inner).__name__)

    def schedule(self, view):
        plan = self.inner.schedule(view)
        self.records.append(PlanRecord(view.clock, view.step, {v.req_id: v.is_decode for v in view.running},
                                       tuple(v.req_id for v in view.waiting), view.num_free_blocks,
                                       copy.deepcopy(plan)))
        return plan

    def on_finished(self, view) -> None:
        self.inner.on_finished(view)


def model_config(name: str) -> ModelConfig:
    """A ModelConfig from configs/model/<name>.yaml."""
    from omegaconf import OmegaConf
    path = CONFIG_DIR / "model" / f"{name}.yaml"
    return ModelConfig(**OmegaConf.to_container(OmegaConf.load(path)))


# Policy scenarios are written in steps of a few milliseconds (arrivals that land mid-burst, a
# decode pace against a TPOT SLO): a fixed 4 ms per step, on roofline numbers pinned here (without
# kernel latency), keeps them independent of later roofline refits.
SCENARIO_HARDWARE = HardwareConfig(flops_efficiency=0.68, bw_efficiency=0.68, kernel_latency=0.0, step_overhead=0.004)


def scenario_dataplane(hardware: HardwareConfig) -> DataplaneConfig:
    """The sim plane's config for `hardware`: the scenario hardware keeps the roofline it was
    pinned on (its 4 ms steps must not move when the default cost model does); any other
    hardware gets the default cost model."""
    if hardware is SCENARIO_HARDWARE:
        return DataplaneConfig(kind="sim", cost_model="roofline")
    return DataplaneConfig(kind="sim")


def replay(policy, trace, cfg: EngineConfig, seed: int = 0, model: str | ModelConfig = "tiny",
           hardware: HardwareConfig | None = None, prefix_block_tokens: int = 512,
           cost_model: str | None = None) -> tuple[RunResult, list]:
    """Run `trace` with `policy`; returns (result, records). `cost_model` pins the sim's cost
    model (None: the scenario hardware's roofline, any other hardware's default).

    A policy instance is used as it is (inspect its state afterwards); any other spec the
    loader accepts is built fresh.
    """
    is_instance = callable(getattr(policy, "schedule", None)) and not inspect.isclass(policy)
    instance = policy if is_instance else policy_factory(policy)()
    model = model_config(model) if isinstance(model, str) else model
    hardware = hardware or SCENARIO_HARDWARE
    plane_cfg = scenario_dataplane(hardware) if cost_model is None else DataplaneConfig(kind="sim", cost_model=cost_model)
    dataplane = SimDataPlane(model, hardware, plane_cfg, seed=seed)
    records: list = []
    engine = Engine(list(trace), _Recorder(instance, records), dataplane, cfg, seed=seed,
                    prefix_block_tokens=prefix_block_tokens)
    result = engine.run()
    if result.partial:
        raise RuntimeError(f"replay of {engine.policy_name} ended early: {result.error}")
    return result, records

