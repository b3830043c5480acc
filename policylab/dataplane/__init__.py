"""Data planes: `torch` runs a real paged-KV transformer, `sim` a cost model (policylab.dataplane.config)."""
from __future__ import annotations

from policylab.core.config import HardwareConfig, ModelConfig
from policylab.dataplane.config import PLANE_OF, SimPlaneConfig, TorchPlaneConfig


def build_dataplane(dp, model: ModelConfig, hardware: HardwareConfig, seed: int = 0):
    """The plane `dp` (a plane's config dataclass, policylab.dataplane.config) configures."""
    if isinstance(dp, SimPlaneConfig):
        from policylab.dataplane.sim import SimDataPlane
        return SimDataPlane(model, hardware, dp, seed)
    if isinstance(dp, TorchPlaneConfig):
        from policylab.dataplane.cpu_host import resolve_step_time
        resolve_step_time(dp.step_time, "cpu")                         # a bad value fails before the model loads
        from policylab.dataplane.torch_plane import TorchDataPlane   # imports torch: slow, so lazy
        plane = TorchDataPlane.from_config(dp, model, seed)
        if resolve_step_time(dp.step_time, plane.device.type) == "model":
            from policylab.dataplane.modeled_time import ModeledStepTime
            from policylab.dataplane.sim import SimDataPlane
            return ModeledStepTime(plane, SimDataPlane(model, hardware, dp.model_timing(), seed))
        return plane
    plane = PLANE_OF.get(type(dp))                # a plane of your own: its class has a Config dataclass
    if plane is None:
        raise ValueError(f"dataplane: {type(dp).__name__} is not a data plane config (policylab.dataplane.config)")
    return plane(model, hardware, dp, seed)
