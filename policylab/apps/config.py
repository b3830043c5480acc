"""The Hydra face of the configuration: the run schema, its ConfigStore entry, and the one
conversion of a composed config into plain typed dataclasses.

Only the app layer imports Hydra. Every job calls `typed_config(cfg)` once and hands the
result down, so the engine, the data planes and the policies never see an OmegaConf node
(a node read goes through OmegaConf's resolver: 3x the replay time of a 20k-request trace).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, is_dataclass
from difflib import get_close_matches
from importlib.resources import files
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from policylab.analysis.qoe import check_qoe_config
from policylab.apps.config_checks import check_values
from policylab.cluster.config import POOLS, ClusterConfig, check_cluster_config, policy_label, spec_name
from policylab.core.config import (EngineConfig, FairnessConfig, HardwareConfig, LoggerConfig, ModelConfig,
                                   QoeConfig, SloConfig, check_engine_config, check_slo_config)
from policylab.core.extensions.speculation import SpeculativeConfig, check_speculative_config
from policylab.dataplane.config import SimPlaneConfig, TorchPlaneConfig, plane_config
from policylab.dataplane.serving_engine import ServingEngineConfig
from policylab.traces.config import TraceConfig



def _config_dir() -> str:
    """The configs/ beside this source tree when there is one (a checkout or worktree run with
    PYTHONPATH must not read another checkout's configs through its editable install), else
    the copy shipped in the wheel."""
    checkout = Path(__file__).resolve().parents[2] / "configs"
    return str(checkout) if (checkout / "config.yaml").is_file() else str(files("policylab.configs"))


CONFIG_DIR = _config_dir()


def presets(group: str) -> list:
    """The preset names of a config group (configs/GROUP/*.yaml), sorted."""
    return sorted(p.stem for p in (Path(CONFIG_DIR) / group).glob("*.yaml"))


@dataclass
class CapacityConfig:
    """`python -m policylab capacity`: bisection on the trace's rate_scale."""
    target: float = 0.9     # SLO attainment to hold (share of all requests)
    lo: float = 0.5         # rate_scale bracket to start from
    hi: float = 8.0
    iters: int = 7          # bisection steps inside the bracket (precision: (hi/lo)^(1/2^iters))
    widen: int = 3          # times the bracket may move by ×/÷ (hi/lo) when the capacity is outside it
    min_replay_s: float = 30.0   # seconds of arrivals each replay spans at least (the trace is tiled to reach it)
    sustain: bool = True         # tile to min_replay_s, then confirm the capacity over twice that (steady state)
    steady_rounds: int = 3       # times the span may double until the capacity holds over twice its span


@dataclass
class GenerateConfig:
    """`python -m policylab generate prompt=...`: one real prompt through the full engine."""
    prompt: str = "The capital of France is"
    max_new_tokens: int = 48
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    chat: bool = False              # wrap the prompt as a user turn of the model's chat template


@dataclass
class FidelityConfig:
    """`python -m policylab fidelity`: replays of the real plane to compare with instead of two fresh ones."""
    real_runs: list = field(default_factory=list)   # two run directories of `policylab run` with this config


@dataclass
class RunConfig:
    seed: int = 0
    engine: EngineConfig = field(default_factory=EngineConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    fairness: FairnessConfig = field(default_factory=FairnessConfig)
    qoe: QoeConfig = field(default_factory=QoeConfig)           # expected first token and reading pace (QoE)
    trace: TraceConfig = field(default_factory=TraceConfig)
    policy: Any = MISSING           # {_target_: importable Policy class, name: ..., **params}
    cluster: ClusterConfig = field(default_factory=ClusterConfig)   # replicas, P/D split, link
    router: Any = None              # {_target_: importable Router class, ...}: who gets each arrival
    decode_router: Any = None       # P/D: who decodes each prefilled request
    dataplane: Any = None           # {_target_: a data plane class, ...}: policylab.dataplane.config
    model: ModelConfig = field(default_factory=ModelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    serving_engine: ServingEngineConfig = field(default_factory=ServingEngineConfig)   # the sim's engine costs
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    capacity: CapacityConfig = field(default_factory=CapacityConfig)   # `policylab capacity` search
    generate: GenerateConfig = field(default_factory=GenerateConfig)   # `policylab generate`
    fidelity: FidelityConfig = field(default_factory=FidelityConfig)   # `policylab fidelity`
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)   # draft tokens (speculative decoding)
    objective: str = "goodput"   # summary key `run` returns to sweepers (Optuna): slo_attainment, ttft.p99, ...
    progress: bool = True        # progress bar over requests
    plots: Any = True            # run plots: false, or {format: png,svg,pdf, log_latency: true, dpi: 150}


def plot_settings(value) -> "PlotSettings":
    """`plots=false`, `plots=true` or the `plots` section (`plots.format=png,svg,pdf`) as PlotSettings."""
    from policylab.analysis.plots import PlotSettings
    if isinstance(value, bool) or value is None:
        return PlotSettings(enabled=bool(value))
    if isinstance(value, DictConfig):
        value = OmegaConf.to_container(value, resolve=True)
    if not isinstance(value, dict):
        raise ConfigError(f"plots={value!r}: expected true, false or keys format, log_latency, dpi")
    unknown = set(value) - {"enabled", "format", "log_latency", "dpi"}
    if unknown:
        raise ConfigError(f"plots.{sorted(unknown)[0]}: unknown key (known: enabled, format, log_latency, dpi)")
    formats = value.get("format", "png")
    formats = [f.strip().lower() for f in (formats.split(",") if isinstance(formats, str) else formats)]
    bad = [f for f in formats if f not in ("png", "svg", "pdf")]
    if bad or not formats:
        raise ConfigError(f"plots.format={','.join(formats)}: each format is png, svg or pdf")
    return PlotSettings(bool(value.get("enabled", True)), tuple(formats), bool(value.get("log_latency", True)),
                        int(value.get("dpi", 150)))

    def __post_init__(self):
        if self.dataplane is None:          # a RunConfig built by hand: the default group, torch
            self.dataplane = TorchPlaneConfig()


def register() -> None:
    ConfigStore.instance().store(name="run_schema", node=RunConfig)
    # the launching process's id in output directory names (configs/config.yaml): unique among
    # concurrent runs, where the time alone is shared by runs started in the same second
    OmegaConf.register_new_resolver("policylab_pid", os.getpid, use_cache=True, replace=True)
    # the policy part of output directory names: the policy, or PREFILL+DECODE with P/D pool policies
    OmegaConf.register_new_resolver("policylab_policy", _policy_part, replace=True)


def _policy_part(*, _root_: DictConfig) -> str:
    """`${policylab_policy:}`: the run's policy name, or PREFILL+DECODE when the P/D pools run their
    own policies (`cluster.prefill_policy` / `cluster.decode_policy`: a name, `{name: ...}` or a group node)."""
    def name(node):
        return None if node is None else spec_name(node if isinstance(node, str) else dict(node))
    cluster = _root_.get("cluster") or {}
    return policy_label(spec_name(_root_.policy), *(name(cluster.get(f"{pool}_policy")) for pool in POOLS))


class PolicySpec(dict):
    """The policy group as a plain dict (`_target_`, `name`, the policy's own parameters)."""

    @property
    def name(self) -> str:
        return str(self.get("name", self.get("_target_", "policy")))


class ConfigError(ValueError):
    """A config value that cannot be turned into its typed field; names the key."""


def typed_config(cfg: DictConfig | RunConfig) -> RunConfig:
    """The composed config as plain dataclasses (interpolations resolved, the policy a plain dict).

    Every job entry point calls it, so each works from a composed config (CLI, compose API)
    or from a RunConfig built by hand; a RunConfig comes back as it is."""
    if not isinstance(cfg, DictConfig):
        return cfg
    try:
        run = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as e:
        raise ConfigError(f"config: no value for {e.full_key}: add {e.full_key}=...") from None
    except OmegaConfBaseException as e:
        raise ConfigError(f"config: {e}".splitlines()[0]) from None
    if cfg.get("dataplane") is not None:
        run.dataplane = _dataplane_node(cfg.dataplane)
    if isinstance(run.dataplane, SimPlaneConfig):      # the engine the simulated steps run in
        run.dataplane.serving_engine = run.serving_engine
    if run.model.config or run.model.name == "hf":      # model=hf model.config=PATH: the shape from config.json
        if not run.model.config:
            raise ConfigError("config: model=hf reads the model's shape from its Hugging Face config.json: "
                              "add model.config=PATH (the file, or the folder holding it)")
        run.model = _hf_model(run.model)
    run.policy = PolicySpec(OmegaConf.to_container(cfg.policy, resolve=True))
    for key in ("router", "decode_router"):
        if cfg.get(key) is not None:
            setattr(run, key, PolicySpec(_router_node(cfg, key)))
    for pool in POOLS:
        key = f"{pool}_policy"
        if cfg.cluster.get(key) is not None:
            setattr(run.cluster, key, PolicySpec(_pool_policy_node(cfg, key)))
    check_run_config(run)
    if run.cluster.disaggregated:       # the config says what each pool ran (summary.json, W&B config)
        for pool in POOLS:
            if getattr(run.cluster, f"{pool}_policy") is None:
                setattr(run.cluster, f"{pool}_policy", PolicySpec(run.policy))
    return run


def _hf_model(model: ModelConfig) -> ModelConfig:
    """The run's model with the shape its Hugging Face config.json states; a key set on the command
    line (any value but the schema's default) wins over the file's."""
    from dataclasses import replace
    from policylab.dataplane.hf_config import HfConfigError, model_from_hf_config
    try:
        shape = model_from_hf_config(model.config, replace(ModelConfig(), name=model.name))
    except HfConfigError as e:
        raise ConfigError(f"config: {e}") from None
    default = ModelConfig()
    given = {f.name: getattr(model, f.name) for f in fields(ModelConfig)
             if getattr(model, f.name) != getattr(default, f.name) and f.name not in ("name", "source", "path")}
    return replace(shape, **given)


def typed_dataplane(node):
    """The plane config of a run's `dataplane` (a composed node is typed; a dataclass comes back as it is)."""
    return _dataplane_node(node) if isinstance(node, DictConfig) else node


def _dataplane_node(node: DictConfig):
    """The `dataplane` group as its plane's typed config: keys checked against that plane's
    dataclass (policylab.dataplane.config), values converted to its field types."""
    values = OmegaConf.to_container(node, resolve=True)
    try:
        plane = plane_config(values)
        values.pop("_target_", None)
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(type(plane)), values))
    except OmegaConfBaseException as e:
        raise ConfigError(f"config: dataplane.{e.full_key}: {str(e).splitlines()[0]}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config: {e}") from None


def pool_policy(run: RunConfig, pool: str) -> dict:
    """The step policy spec of a P/D pool (`prefill` or `decode`): its own, else the run's."""
    return getattr(run.cluster, f"{pool}_policy") or run.policy


def run_policy_label(run: RunConfig) -> str:
    """What the run is named by: the policy, or under P/D with per-pool policies `PREFILL+DECODE`
    (as its run directory: `${policylab_policy:}` in configs/config.yaml)."""
    name = spec_name(run.policy)
    if not run.cluster.disaggregated:
        return name
    return policy_label(name, *(spec_name(pool_policy(run, pool)) for pool in POOLS))


def check_run_config(run: RunConfig) -> None:
    """Refuse, before anything runs, keys no typed group has (`+trace.max_request=10`, a typo
    Hydra's own hint suggests, was silently ignored) and values the engine or metrics cannot use."""
    known_groups = {f.name for f in fields(run)}
    extra = sorted(k for k in vars(run) if k not in known_groups)
    if extra:
        close = get_close_matches(extra[0], known_groups, n=1)
        raise ConfigError(f"config: {extra[0]} is not a key of the run config"
                          + (f" (did you mean {close[0]}?)" if close else f"; it has {', '.join(sorted(known_groups))}"))
    for group in fields(run):
        node = getattr(run, group.name)
        if is_dataclass(node):
            known = {f.name for f in fields(node)}
            unknown = sorted(k for k in vars(node) if k not in known)
            if unknown:
                close = get_close_matches(unknown[0], known, n=1)
                raise ConfigError(f"config: {group.name}.{unknown[0]} is not a key of {group.name}"
                                  + (f" (did you mean {group.name}.{close[0]}?)" if close else
                                     f"; it has {', '.join(sorted(known))}"))
    try:
        check_engine_config(run.engine)
        check_slo_config(run.slo, run.fairness)
        check_qoe_config(run.qoe)
        check_cluster_config(run.cluster)
        check_speculative_config(run.speculative)
        if isinstance(run.dataplane, SimPlaneConfig):       # (before a long trace is read, not after)
            from policylab.dataplane.sim import check_cost_parameters
            check_cost_parameters(run.model, run.hardware, run.dataplane)
        check_values(run)
    except ValueError as e:
        raise ConfigError(f"config: {e}") from None


def _pool_policy_node(cfg: DictConfig, key: str) -> dict:
    """`cluster.prefill_policy` / `cluster.decode_policy` as a policy spec dict. Three spellings:
    a name of configs/policy/ (`cluster.decode_policy=decode_first`); a name with parameter
    overrides (`cluster.prefill_policy={name:chunked,chunk_size:2048}`); or the policy group under
    that package (`policy@cluster.prefill_policy=chunked cluster.prefill_policy.chunk_size=2048`),
    which is a full `_target_` node already. YAML interpolations (${slo.ttft}) resolve against the run."""
    node = cfg.cluster[key]
    if isinstance(node, DictConfig) and "_target_" in node:
        return OmegaConf.to_container(node, resolve=True)
    overrides = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else {"name": node}
    name = overrides.pop("name", None) if isinstance(overrides, dict) else None
    path = Path(CONFIG_DIR) / "policy" / f"{name}.yaml"
    known = sorted(p.stem for p in path.parent.glob("*.yaml"))
    if not isinstance(name, str):
        raise ConfigError(f"cluster.{key}: name the policy, as cluster.{key}=NAME or cluster.{key}={{name:NAME,"
                          f"PARAM:VALUE}}; available policies (configs/policy/): {', '.join(known)}")
    if not path.is_file():
        close = get_close_matches(name, known, n=1)
        raise ConfigError(f"cluster.{key}={name}: no such policy" + (f" (did you mean {close[0]}?)" if close else "")
                          + f"; available policies (configs/policy/): {', '.join(known)}")
    policy = OmegaConf.load(path)
    unknown = [k for k in overrides if k not in policy]
    if unknown:
        params = sorted(k for k in policy if k not in ("_target_", "name"))
        raise ConfigError(f"cluster.{key}: {unknown[0]} is not a parameter of policy {name} "
                          f"({', '.join(params) if params else 'it has none'})")
    policy = OmegaConf.merge(policy, overrides)
    run = {k: v for k, v in OmegaConf.to_container(cfg, resolve=False).items() if k != "hydra"}
    holder = OmegaConf.create({**run, "_pool_policy_": policy})
    return OmegaConf.to_container(holder["_pool_policy_"], resolve=True)


def _router_node(cfg: DictConfig, key: str) -> dict:
    """A router group node as a dict; a bare name (`decode_router=least_loaded`, a value and not a
    group override, since decode_router is the router group under another package) is read from
    configs/router/NAME.yaml, its ${seed} resolved against the run."""
    node = cfg[key]
    if isinstance(node, str):
        path = Path(CONFIG_DIR) / "router" / f"{node}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in path.parent.glob("*.yaml"))
            raise ConfigError(f"{key}={node}: no configs/router/{node}.yaml (known: {', '.join(known)})")
        node = OmegaConf.create({"seed": cfg.seed, key: OmegaConf.load(path)})[key]
    return OmegaConf.to_container(node, resolve=True)
