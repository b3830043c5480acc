"""Data planes: `torch` runs a real paged-KV transformer, `sim` a roofline cost model."""
from __future__ import annotations

from policylab.core.config import DataplaneConfig, HardwareConfig, ModelConfig


def build_dataplane(dp: DataplaneConfig, model: ModelConfig, hardware: HardwareConfig, seed: int = 0):
    if dp.kind == "sim":
        from policylab.dataplane.sim import SimDataPlane
        return SimDataPlane(model, hardware, dp, seed)
    if dp.kind == "torch":
        from policylab.dataplane.modeled_time import STEP_TIMES
        if dp.step_time not in STEP_TIMES:
            raise ValueError(f"dataplane.step_time must be one of {STEP_TIMES}, got '{dp.step_time}'")
        from policylab.dataplane.torch_plane import TorchDataPlane   # imports torch: slow, so lazy
        plane = TorchDataPlane.from_config(dp, model, seed)
        if dp.step_time == "model":
            from policylab.dataplane.modeled_time import ModeledStepTime
            from policylab.dataplane.sim import SimDataPlane
            return ModeledStepTime(plane, SimDataPlane(model, hardware, dp, seed))
        return plane
    raise ValueError(f"dataplane.kind must be 'torch' or 'sim', got '{dp.kind}'")
