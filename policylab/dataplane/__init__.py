"""Data planes: `torch` runs a real paged-KV transformer, `sim` a roofline cost model."""
from __future__ import annotations

from policylab.core.config import DataplaneConfig, HardwareConfig, ModelConfig


def build_dataplane(dp: DataplaneConfig, model: ModelConfig, hardware: HardwareConfig, seed: int = 0):
    if dp.kind == "sim":
        from policylab.dataplane.sim import SimDataPlane
        return SimDataPlane(model, hardware, dp, seed)
    if dp.kind == "torch":
        from policylab.dataplane.torch_plane import TorchDataPlane   # imports torch: slow, so lazy
        return TorchDataPlane.from_config(dp, model, seed)
    raise ValueError(f"dataplane.kind must be 'torch' or 'sim', got '{dp.kind}'")
