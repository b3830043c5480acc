"""Typed building of one engine of a run (alone, or one replica of a cluster): its policy and data
plane with the run's speculative settings, and the extensions the run asks for."""
from __future__ import annotations

from policylab.apps.config import RunConfig
from policylab.apps.speculative_build import speculative_parts
from policylab.core.engine import Engine
from policylab.core.extensions import extensions_for


def engine_of(cfg: RunConfig, trace, policy, plane, sessions=None) -> Engine:
    """One engine of the run (alone, or a cluster's replica: `sessions` then None, the cluster's):
    the policy and plane with the run's speculative settings, the extensions the run asks for."""
    policy, plane = speculative_parts(cfg, policy, plane)
    extensions = extensions_for(trace, cfg.engine, plane.capabilities, speculative=cfg.speculative,
                                sessions=sessions, prefix_block_tokens=cfg.trace.prefix_block_tokens)
    return Engine(trace, policy, plane, cfg.engine, seed=cfg.seed, prefix_block_tokens=cfg.trace.prefix_block_tokens,
                  extensions=extensions, sessions=sessions)
