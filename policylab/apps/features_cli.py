"""`python -m policylab features`: which features compose, on which data plane and topology.

The table is made from the declarations (`policylab.core.features`) and the planes' declared
capabilities, the very ones a run is checked against before it starts; docs/compatibility.md is
its output (`python -m policylab features`), and a test keeps the two equal.
"""
from __future__ import annotations

import argparse

from policylab.core.features import FEATURES, TOPOLOGIES, composition_table
from policylab.dataplane.sim import SIM_CAPABILITIES
from policylab.dataplane.torch_plane import TORCH_CAPABILITIES

PLANES = {"sim": SIM_CAPABILITIES, "torch": TORCH_CAPABILITIES, "vllm": frozenset()}
TOPOLOGY_HEADS = {"engine": "one engine", "replicas": "replicas", "pd": "P/D"}


def render_table() -> str:
    """The markdown table: a row per pair of features (a feature alone on the diagonal), a column
    per plane and topology; ✓ composes, else the number of the refusal listed under the table."""
    rows, reasons, cells = {}, {}, {}
    for a, b, plane, topology, verdict in composition_table(PLANES):
        key = (a, b)
        rows.setdefault(key, None)
        if verdict == "composes":
            cells[key, plane, topology] = "✓"
        else:
            number = reasons.setdefault(verdict, len(reasons) + 1)
            cells[key, plane, topology] = f"✗ {number}"
    columns = [(plane, topology) for topology in TOPOLOGIES for plane in PLANES]
    head = "| features | " + " | ".join(f"{plane}, {TOPOLOGY_HEADS[t]}" for plane, t in columns) + " |"
    lines = [head, "|" + " --- |" * (len(columns) + 1)]
    for a, b in rows:
        name = a if a == b else f"{a} + {b}"
        lines.append(f"| {name} | " + " | ".join(cells[(a, b), plane, t] for plane, t in columns) + " |")
    lines.append("")
    lines += [f"{n}. {why}" for why, n in reasons.items()]
    return "\n".join(lines) + "\n"


def render_features() -> str:
    """One line per feature: what it is, how a run turns it on, where summary.json shows it."""
    return "\n".join(f"- **{f.name}**: {f.what} (summary.json: `{f.section}`)" for f in FEATURES.values()) + "\n"


def main(argv: list) -> int:
    ap = argparse.ArgumentParser(prog="python -m policylab features", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.parse_args(argv)
    print(render_features())
    print(render_table())
    return 0
