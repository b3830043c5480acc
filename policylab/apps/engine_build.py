"""Typed building of one engine of a run (alone, or one replica of a cluster): its policy and data
plane with the run's speculative settings, and the extensions the run asks for."""
from __future__ import annotations

import dataclasses

from policylab.apps.config import RunConfig
from policylab.apps.errors import RunError
from policylab.apps.speculative_build import speculative_parts
from policylab.core.engine import Engine
from policylab.core.extensions import extensions_for


def engine_of(cfg: RunConfig, trace, policy, plane, sessions=None) -> Engine:
    """One engine of the run (alone, or a cluster's replica: `sessions` then None, the cluster's):
    the policy and plane with the run's speculative settings, the extensions the run asks for."""
    policy, plane = speculative_parts(cfg, policy, plane)
    attach_gpu_clock(cfg, policy, plane)
    cfg = with_policy_defaults(cfg, policy)
    extensions = extensions_for(trace, cfg.engine, plane.capabilities, speculative=cfg.speculative,
                                sessions=sessions, prefix_block_tokens=cfg.trace.prefix_block_tokens,
                                client_timeout=cfg.trace.client_timeout)
    return Engine(trace, policy, plane, cfg.engine, seed=cfg.seed, prefix_block_tokens=cfg.trace.prefix_block_tokens,
                  extensions=extensions, sessions=sessions)


def attach_gpu_clock(cfg: RunConfig, policy, plane) -> None:
    """A policy that sets the GPU clock (`attach_clock`, e.g. energy_aware) gets one the plane follows."""
    if not hasattr(policy, "attach_clock"):
        return
    if not hasattr(plane, "attach_clock") or getattr(plane, "energy_report", lambda: None)() is None:
        raise RunError(f"policy {getattr(policy, 'name', type(policy).__name__)} sets the GPU clock: it needs a "
                       f"plane timed by a GPU cost model with a power model (dataplane=sim, or dataplane.step_time="
                       f"model with a GPU hardware=...), not hardware '{cfg.hardware.name}' here")
    from policylab.dataplane.energy import GpuClock
    try:
        clock = GpuClock(cfg.hardware, getattr(cfg.dataplane, "gpu_clock_mhz", None))
        policy.attach_clock(clock)
    except ValueError as e:
        raise RunError(str(e)) from None
    plane.attach_clock(clock)


def with_policy_defaults(cfg: RunConfig, policy) -> RunConfig:
    """`cfg` with the engine settings the policy is written for (`Policy.engine_defaults`) where the
    run left them unset (None): vllm_v1 runs as vLLM does, whatever the engine's default."""
    wanted = {k: v for k, v in getattr(policy, "engine_defaults", {}).items() if getattr(cfg.engine, k) is None}
    return dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, **wanted)) if wanted else cfg
