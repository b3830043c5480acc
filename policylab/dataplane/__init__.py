"""Data planes: `torch` runs a real paged-KV transformer, `sim` a roofline cost model."""
from __future__ import annotations

from policylab.core.config import DataplaneConfig, HardwareConfig, ModelConfig


def build_dataplane(dp: DataplaneConfig, model: ModelConfig, hardware: HardwareConfig, seed: int = 0):
    if dp.kind == "sim":
        from policylab.dataplane.sim import SimDataPlane
        return SimDataPlane(model, hardware, dp, seed)
    if dp.kind == "torch":
        from policylab.dataplane.cpu_host import resolve_step_time
        resolve_step_time(dp.step_time, "cpu")                         # a bad value fails before the model loads
        from policylab.dataplane.torch_plane import TorchDataPlane   # imports torch: slow, so lazy
        plane = TorchDataPlane.from_config(dp, model, seed)
        if resolve_step_time(dp.step_time, plane.device.type) == "model":
            from policylab.dataplane.modeled_time import ModeledStepTime
            from policylab.dataplane.sim import SimDataPlane
            return ModeledStepTime(plane, SimDataPlane(model, hardware, dp, seed))
        return plane
    raise ValueError(f"dataplane.kind must be 'torch' or 'sim', got '{dp.kind}'")
