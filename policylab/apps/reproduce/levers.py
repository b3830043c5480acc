"""Levers a reproduction may need beyond what every replay has, and whether this engine has them.

A lever is present when the module that provides it can be imported. An entry that `requires`
a missing lever is listed (`reproduce --list`) as waiting for it, with the setting it will
replay; it runs as soon as the lever's module exists and the entry has its `measure`.
"""
from __future__ import annotations

import importlib.util

LEVERS = {
    # live migration of a running request between replicas (KV copied block by block while it
    # decodes, then a stop-and-copy), priced on the link and exposed to routers as a decision
    "migration": "policylab.cluster.migration",
}


def available(lever: str) -> bool:
    module = LEVERS.get(lever)
    if module is None:
        raise KeyError(f"unknown lever {lever!r} (known: {', '.join(LEVERS)})")
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False
