"""`speculative.*` applied to a run: the fixed-k wrapper around its policy, the drafts' pricing
and acceptance model on its data plane (policylab.core.extensions.speculation, policylab.dataplane.speculative)."""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from policylab.apps.config import CONFIG_DIR, ConfigError, RunConfig
from policylab.core.config import ModelConfig
from policylab.core.speculative_plan import FixedSpeculation
from policylab.dataplane.config import SimPlaneConfig


def draft_model_config(name: str) -> ModelConfig:
    """The shape `speculative.draft_model` names: a configs/model/ file."""
    path = Path(CONFIG_DIR) / "model" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ConfigError(f"speculative.draft_model={name}: no such model config; available (configs/model/): "
                          f"{', '.join(known)}")
    node = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    node = {k: v for k, v in node.items() if k != "defaults"}
    try:
        return ModelConfig(**node)
    except TypeError as e:
        raise ConfigError(f"speculative.draft_model={name}: {path} is not a model config ({e})") from None


def speculative_parts(cfg: RunConfig, policy, plane) -> tuple:
    """(policy, data plane) with the run's speculative settings: `speculative.k` wraps the policy,
    the sim gets its acceptance model and the draft's price, the torch plane its n-gram settings."""
    spec = cfg.speculative
    if spec.k:
        policy = FixedSpeculation(policy, spec.k)
    base = getattr(plane, "plane", plane)           # (the real plane under a modelled step time)
    if hasattr(base, "speculation"):                # the sim
        from policylab.dataplane.speculative import SimSpeculation
        draft = None
        if spec.method == "draft":
            from policylab.dataplane.sim import build_cost_model
            draft = build_cost_model(draft_model_config(spec.draft_model), cfg.hardware,
                                     SimPlaneConfig())
        base.speculation = SimSpeculation(spec, cfg.seed, draft)
    elif spec.method != "ngram":                    # the torch plane: the engine drafts by prompt lookup only
        raise ConfigError("speculative.method=draft runs on the sim only; the torch plane drafts by "
                          "n-gram lookup (speculative.method=ngram)")
    return policy, plane
