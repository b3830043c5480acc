"""Which shipped presets a served model's name and a GPU's name mean.

A load generator records the model as the server named it (a Hugging Face id, a local path, an
alias), and a benchmark table names its GPU as its author wrote it ("H100-80GB", "NVIDIA H100 80GB
HBM3"). A replay needs a configs/model and a configs/hardware preset. A name is matched on what
decides the cost (family, size, expert layout, GPU part and memory), never on a family alone:
a quantized checkpoint (AWQ, GPTQ, FP8) keeps its suffix and so matches no BF16 preset, and a GPU
whose memory or form factor differs from its preset's is refused, with the key that would fix it.
"""
from __future__ import annotations

import re
from difflib import get_close_matches
from pathlib import Path

from omegaconf import OmegaConf

from policylab.apps.config import CONFIG_DIR, presets

# names that do not spell their preset, compacted (Llama 3.1 8B runs Llama 3 8B's layers)
ALIASES = {"llama318b": "llama3-8b"}
NOT_CHECKPOINTS = {"hf", "tiny"}  # presets no server serves: hf (a config.json's), tiny (the tests')
# trailing parts of a checkpoint's name that change neither its shapes nor its weights' dtype
SAME_WEIGHTS = {"hf", "chat", "instruct", "base", "python"}
VERSION = re.compile(r"v\d+(\.\d+)*")
MEMORY = re.compile(r"(\d+)\s*gb")
MEMORY_TOLERANCE = 0.12          # "80GB" on the box against the 85.06e9 bytes CUDA reports of an H100
# parts that share a preset's name but not its bandwidth or memory
OTHER_PARTS = {"h100": ("pcie", "nvl")}


def _compact(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def model_preset(name: str) -> str | None:
    """The configs/model preset a served model's name means, or None: the name's last path part, less
    its chat/instruct/hf/version suffixes, spelling a preset's name (punctuation and case aside):
    "meta-llama/Llama-2-70b-chat-hf" and "Llama-2-70B" are llama2-70b."""
    by_name = {compact: [preset] for compact, preset in ALIASES.items()}
    for preset in presets("model"):
        if preset in NOT_CHECKPOINTS:
            continue
        by_name.setdefault(_compact(preset), []).append(preset)
    parts = Path(name.strip().rstrip("/")).name.lower().split("-")
    if parts[0] == "meta" and len(parts) > 1:            # Meta-Llama-3-8B
        parts.pop(0)
    while True:
        matches = by_name.get(_compact("-".join(parts)), [])
        if len(matches) == 1:
            return matches[0]
        if len(parts) == 1 or not (parts[-1] in SAME_WEIGHTS or VERSION.fullmatch(parts[-1])):
            return None
        parts.pop()


def gpu_preset(name: str) -> str:
    """The configs/hardware preset a GPU's name means: a preset's own name, or a name it spells as a word
    ("H100-80GB", "NVIDIA A100-SXM4-80GB"); a ValueError naming the fix where none does, or where the
    name's memory or form factor is not the preset's."""
    lowered = name.strip().lower()
    known = [p for p in presets("hardware") if p != "cpu"] + ["cpu"]
    if lowered in known:
        return lowered
    found = [p for p in known if re.search(rf"(?<![a-z0-9]){re.escape(p)}(?![0-9])", lowered)]
    if len(found) != 1:
        close = get_close_matches(lowered, known, n=1) if not found else []
        raise ValueError(f"'{name}': {'no' if not found else 'more than one'} preset in its name"
                         + (f" (did you mean {close[0]}?)" if close else "") + f"; one of {', '.join(known)}")
    preset = found[0]
    other = [part for part in OTHER_PARTS.get(preset, ()) if part in lowered]
    if other:
        raise ValueError(f"'{name}': the {preset} preset is the SXM part; its {other[0].upper()} version "
                         f"differs in bandwidth and memory (give a hardware preset of its own)")
    said = MEMORY.search(lowered)
    if said:
        preset_gb = float(OmegaConf.load(Path(CONFIG_DIR) / "hardware" / f"{preset}.yaml").mem_bytes) / 1e9
        if abs(float(said.group(1)) / preset_gb - 1) > MEMORY_TOLERANCE:
            raise ValueError(f"'{name}': the {preset} preset has {preset_gb:g} GB, not {said.group(1)} GB: "
                             f"set hardware.mem_bytes (the bytes CUDA reports)")
    return preset
