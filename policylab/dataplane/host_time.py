"""Host time per step: what the serving engine's CPU side adds to the GPU's kernel time.

An engine step is not only kernels: the scheduler runs, inputs are prepared and copied, the
kernels are launched (one by one without CUDA graphs), sampled ids come back. What is not
hidden behind the GPU is modelled as

    host = step_overhead + host_per_request x requests + host_per_token x scheduled tokens

(`hardware.step_overhead`, `hardware.host_per_request`, `hardware.host_per_token`). The default
is 0: extra host time a user measured, on top of the serving engine's own host work
(`policylab.dataplane.serving_engine`: configs/serving_engine/ presets, `serving_engine=vllm`).
"""
from __future__ import annotations

from policylab.core.config import HardwareConfig


class HostTime:
    def __init__(self, hw: HardwareConfig):
        self.fixed, self.per_request, self.per_token = hw.step_overhead, hw.host_per_request, hw.host_per_token
        self.named = hw.host

    def __call__(self, requests: int, tokens: int) -> float:
        return self.fixed + self.per_request * requests + self.per_token * tokens

    def describe(self) -> dict:
        return {"preset": self.named, "per_step": self.fixed, "per_request": self.per_request,
                "per_token": self.per_token}
