"""Hydra launcher and sweeper plugins: which extra installs each, checked before Hydra starts.

Hydra alone says `Could not find 'hydra/launcher/ray'` for a plugin that is not installed, and
a SLURM launcher outside a SLURM cluster fails deep inside submitit. Each choice named on the
command line (or by an `+experiment=` config) is checked here first and refused in one line
that says what to install or why it cannot run."""
from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

# (group, option) -> (plugin module, pip package, policylab extra)
PLUGINS = {
    ("launcher", "joblib"): ("hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher", "sweep"),
    ("launcher", "submitit_local"): ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher", "sweep"),
    ("launcher", "submitit_slurm"): ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher", "sweep"),
    ("launcher", "slurm"): ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher", "sweep"),
    ("launcher", "ray"): ("hydra_plugins.hydra_ray_launcher", "hydra-ray-launcher", "ray"),
    ("launcher", "ray_aws"): ("hydra_plugins.hydra_ray_launcher", "hydra-ray-launcher", "ray"),
    ("sweeper", "optuna"): ("hydra_plugins.hydra_optuna_sweeper", "hydra-optuna-sweeper", "sweep"),
}
SLURM = {"submitit_slurm", "slurm"}
_CHOICE = re.compile(r"^\+?hydra/(launcher|sweeper)=(\w+)$")
_EXPERIMENT_OVERRIDE = re.compile(r"override\s+/hydra/(launcher|sweeper):\s*(\w+)")


def requested(overrides: list, config_dir: str) -> list:
    """(group, option) of each launcher / sweeper the command line asks for, directly or through
    an experiment config's `override /hydra/...` defaults."""
    out = []
    for arg in overrides:
        if m := _CHOICE.match(arg):
            out.append((m[1], m[2]))
        elif arg.startswith(("+experiment=", "experiment=")):
            path = Path(config_dir) / "experiment" / f"{arg.split('=', 1)[1]}.yaml"
            if path.is_file():
                out += [(g, o) for g, o in _EXPERIMENT_OVERRIDE.findall(path.read_text())]
    return out


def missing_plugin(group: str, option: str) -> str | None:
    """Why `hydra/<group>=<option>` cannot run here (None when it can, or is not a plugin we know)."""
    if (group, option) not in PLUGINS:
        return None
    module, package, extra = PLUGINS[(group, option)]
    if importlib.util.find_spec("hydra_plugins") is None or importlib.util.find_spec(module) is None:
        return (f"hydra/{group}={option} needs the {package} plugin: pip install 'policylab[{extra}]' "
                f"(from a clone: pip install -e '.[{extra}]'; docs/sweeps.md)")
    absent = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]
    if option in SLURM and absent:
        return (f"hydra/{group}={option} submits each run as a SLURM job, but `{absent[0]}` is not on PATH "
                "(not a SLURM node): run it there, or sweep on this machine with "
                "hydra/launcher=submitit_local, joblib or ray")
    return None


def check_plugins(overrides: list, config_dir: str) -> str | None:
    """The first reason a requested launcher / sweeper cannot run, or None."""
    for group, option in requested(overrides, config_dir):
        if why := missing_plugin(group, option):
            return why
    return None
