"""What a reproduction leaves: the printout (the paper's claim beside the replay's numbers and the
verdict), `result.json`, `result.md` (its gallery section), `figure.png` and `runs.csv`.

The gallery page (`reproduce all --gallery PAGE`) is the sections of every entry, in the catalog's
order, each with its figure, the paper's numbers, ours, the command and the commit.
"""
from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

from policylab.apps.reproduce.entry import Entry, Outcome
from policylab.apps.reproduce.stats import Measure


def source_commit() -> str:
    """The checkout's commit (short hash, `+changes` when the tree differs from it), or `unknown`."""
    root = Path(__file__).resolve().parents[3]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def paper_text(value, text: str = "") -> str:
    return text or ("—" if value is None else f"{value:g}×")


def printout(entry: Entry, outcome: Outcome, seconds: float, out_dir: Path) -> str:
    lines = [f"{entry.name}: {entry.title} ({entry.paper.venue})",
             f"  paper:  {entry.claim.text}"]
    for c in outcome.comparisons:
        lines.append(f"  {c.label}: paper {paper_text(c.paper, c.paper_text)}, replay {c.ours.text()}")
    lines.append(f"  direction: {outcome.verdict.direction}; magnitude: {outcome.verdict.magnitude}")
    if outcome.verdict.reason:
        lines.append(f"  why: {outcome.verdict.reason}")
    for note in outcome.notes:
        lines.append(f"  note: {note}")
    lines.append(f"  {len(entry.substitutions)} substitutions (result.md); {seconds:.0f} s; files: {out_dir}")
    return "\n".join(lines)


def result_dict(entry: Entry, outcome: Outcome, seconds: float, commit: str, replicates: int, quick: bool) -> dict:
    return {"entry": entry.name, "title": entry.title, "paper": vars(entry.paper), "claim": vars(entry.claim),
            "paper_setting": entry.paper_setting, "replay_setting": entry.replay_setting,
            "substitutions": list(entry.substitutions), "command": entry.command, "commit": commit,
            "replicates": replicates, "quick": quick, "seconds": round(seconds, 1),
            "comparisons": [{"label": c.label, "paper": c.paper, "paper_text": paper_text(c.paper, c.paper_text),
                             "ours": c.ours.as_dict()} for c in outcome.comparisons],
            "verdict": outcome.verdict.as_dict(), "measures": [m.as_dict() for m in outcome.measures],
            "notes": list(outcome.notes)}


def write(entry: Entry, outcome: Outcome, out_dir: Path, seconds: float, commit: str, replicates: int,
          quick: bool) -> dict:
    result = result_dict(entry, outcome, seconds, commit, replicates, quick)
    (out_dir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    draw(outcome.panels, entry.title, out_dir / "figure.png")
    (out_dir / "result.md").write_text(section(entry, result, "figure.png"))
    return result


def draw(panels: list, title: str, path: Path) -> None:
    from matplotlib.figure import Figure
    if not panels:
        return
    fig = Figure(figsize=(max(7.5, 5.2 * len(panels)), 4.2), layout="constrained")
    fig.suptitle(title, fontsize=11)
    for ax, panel in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        if panel.bars:
            labels = list(panel.bars)
            means = [panel.bars[k].mean for k in labels]
            errors = [[max(0.0, m - panel.bars[k].low) if math.isfinite(panel.bars[k].low) else 0 for k, m in
                       zip(labels, means)],
                      [max(0.0, panel.bars[k].high - m) if math.isfinite(panel.bars[k].high) else 0 for k, m in
                       zip(labels, means)]]
            ax.bar(range(len(labels)), means, yerr=errors, capsize=4,
                   color=[f"C{i % 10}" for i in range(len(labels))])
            ax.set_xticks(range(len(labels)), [_wrap(k) for k in labels], fontsize=7)
        for i, (label, (xs, ys)) in enumerate(panel.lines.items()):
            ax.plot(xs, ys, "o-", color=f"C{i % 10}", label=label, markersize=4)
        for label, y in panel.hlines.items():
            ax.axhline(y, color="black", linestyle="--", linewidth=1, label=label or None)
        ax.set(title=panel.title, ylabel=panel.ylabel, xlabel=panel.xlabel)
        ax.title.set_fontsize(9)
        if panel.log_y:
            ax.set_yscale("log")
        if panel.lines or panel.hlines:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=110)


def _wrap(label: str, width: int = 18) -> str:
    words, lines, line = label.split(), [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    return "\n".join(lines + [line])


def section(entry: Entry, result: dict, figure: str) -> str:
    """The gallery section of one reproduction (markdown)."""
    rows = "\n".join(f"| {c['label']} | {c['paper_text']} | {measure_text(c['ours'])} |" for c in result["comparisons"])
    subs = "\n".join(f"- {s}" for s in entry.substitutions)
    notes = "".join(f"\n{n}\n" for n in result.get("notes", []))
    v = result["verdict"]
    return f"""## {entry.title}

{entry.paper.title}, {entry.paper.venue} ([paper]({entry.paper.url})).

**The paper:** {entry.claim.text} ({entry.claim.source})

| | paper | replay (mean [95 % CI], {result['replicates']} replicates) |
|---|---|---|
{rows}

**Direction:** {v['direction']}. **Magnitude:** {v['magnitude']}. {v['reason']}
{notes}
![{entry.name}]({figure})

**Paper's setting:** {entry.paper_setting}

**Replay:** {entry.replay_setting}

**Substitutions:**

{subs}

`{entry.command}` · commit `{result['commit']}` · {result['seconds']:.0f} s on the machine that ran it
"""


def waiting_section(entry: Entry) -> str:
    levers = ", ".join(entry.requires)
    subs = "\n".join(f"- {s}" for s in entry.substitutions)
    return f"""## {entry.title}

{entry.paper.title}, {entry.paper.venue} ([paper]({entry.paper.url})).

**The paper:** {entry.claim.text} ({entry.claim.source})

**Not replayed yet: waiting for the {levers} lever.** `{entry.command}` says so and runs nothing.

**Paper's setting:** {entry.paper_setting}

**Planned replay:** {entry.planned}

**Substitutions it will make:**

{subs}
"""


def measure_text(m: dict) -> str:
    """A result.json measure as `mean [low, high]`."""
    return Measure(m["label"], m["unit"], m["values"], m["geometric"]).text()
