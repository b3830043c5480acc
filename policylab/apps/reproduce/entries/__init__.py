"""The gallery's entries, one module each, in the order `reproduce --list` and the gallery show them."""
from __future__ import annotations

from importlib import import_module

MODULES = ("sarathi", "orca", "vtc", "distserve", "sglang", "mooncake", "autellix", "andes", "llumnix")


def catalog() -> dict:
    """name -> Entry, in gallery order."""
    entries = [import_module(f"{__name__}.{m}").ENTRY for m in MODULES]
    return {e.name: e for e in entries}
