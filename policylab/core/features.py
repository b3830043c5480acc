"""Every feature a run can combine, declared once: what it needs, where it runs, what it composes with.

A run's features come from its trace, its config and its policy (`Policy.features`). Before the
run starts they are checked together with the data plane's declared capabilities and the
topology (one engine, replicas, prefill/decode disaggregation): the combination composes, each
feature's effect then visible in its `summary.json` section, or it is refused with one line naming
the two things that do not go together (`check_combination`). Nothing is dropped silently.
`docs/compatibility.md` is this table, generated (`composition_table`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from policylab.core.capabilities import Capability

TOPOLOGIES = ("engine", "replicas", "pd")      # one engine; colocated replicas; prefill/decode pools


class CombinationError(ValueError):
    """A combination of features, data plane and topology that does not compose (one line)."""


@dataclass(frozen=True)
class Feature:
    name: str
    what: str                          # what it is, and how a run turns it on
    section: str                       # where summary.json shows its effect
    needs: frozenset = frozenset()     # data-plane capabilities
    topologies: tuple = TOPOLOGIES
    on_vllm: bool = False              # runs under dataplane=vllm (vLLM's own engine, our policy)
    needs_config: tuple = ()           # (engine key, why): an engine setting it cannot run without
    refuses: dict = field(default_factory=dict)   # other feature -> why the two do not compose


FEATURES = {f.name: f for f in (
    Feature("forks", "parallel samples: a trace's `n`, or engine.parallel_samples", "forks",
            topologies=("engine", "replicas"),
            refuses={"tool_calls": "a sample's tool calls are not modelled: forks pause with no tool"}),
    Feature("beams", "beam search over forks: a trace's `beam_width`, or engine.beam_width", "forks",
            topologies=("engine", "replicas"),
            refuses={"tool_calls": "a beam's tool calls are not modelled: beams pause with no tool"}),
    Feature("tool_calls", "requests that pause for tool calls: a trace's `tool_calls`, or "
            "+trace.tool_calls={...}", "programs", topologies=("engine", "replicas")),
    Feature("sessions", "closed-loop clients: a session trace, or trace.concurrency=N", "sessions"),
    Feature("speculation", "speculative decoding: speculative.k, or a policy that drafts (spec_adaptive)",
            "speculative", needs=frozenset({Capability.DRAFTS})),
    Feature("swap", "swap preemption: policy.preempt_mode=swap, with engine.host_kv_blocks", "kv_hierarchy",
            needs=frozenset({Capability.KV_BYTES}),
            needs_config=(("host_kv_blocks", "swap preemption needs a host tier: set engine.host_kv_blocks > 0"),)),
    Feature("prefix_tiers", "host and disk tiers under the prefix cache: engine.prefix_host_blocks",
            "kv_hierarchy", needs=frozenset({Capability.KV_BYTES}),
            needs_config=(("enable_prefix_caching", "the prefix tiers hold what the prefix cache evicts: set "
                                                    "engine.enable_prefix_caching=true"),)),
    Feature("radix", "a radix-tree prefix index: engine.prefix_cache=radix", "config", on_vllm=False),
    Feature("client_timeout", "clients that give up on a request: trace.client_timeout=SECONDS", "client_timeout",
            topologies=("engine", "replicas"),
            refuses={"forks": "a timed-out request's samples are not abandoned with it",
                     "beams": "a timed-out request's beams are not abandoned with it",
                     "tool_calls": "a request paused for its tool is not abandoned"}),
    Feature("migration", "live migration of running requests between replicas: a router that rebalances "
            "(router=llumnix)", "migration", topologies=("replicas",),
            refuses={"forks": "samples share KV blocks on one replica: a sample is not migrated alone",
                     "beams": "beams share KV blocks on one replica: a beam is not migrated alone",
                     "tool_calls": "a request's tool-call state stays on its first replica",
                     "client_timeout": "the client's timeout stays on the request's first replica"}),
)}

TOPOLOGY_NAMES = {"engine": "one engine", "replicas": "replicas (cluster.replicas > 1)",
                  "pd": "P/D disaggregation (cluster.prefill_replicas, cluster.decode_replicas)"}


def features_of(trace: list, cfg, policy=None, sessions=None, fixed_drafts: int = 0, client_timeout=None) -> set:
    """The features a run uses: asked for by its trace (samples, beams, tool calls), its engine
    config `cfg` (prefix tiers, the radix index, overrides of samples and beams), its policy
    (`Policy.features`: swap preemption, drafts), a session plan, or a fixed number of drafts
    for every decode (`speculative.k`)."""
    out = set(getattr(policy, "features", ()))
    if cfg.parallel_samples > 1 or any(t.n > 1 for t in trace) and not cfg.beam_width > 1:
        out.add("forks")
    if cfg.beam_width > 1 or any(t.beam_width > 1 for t in trace) and not cfg.parallel_samples > 1:
        out.add("beams")
    if any(t.tool_calls for t in trace):
        out.add("tool_calls")
    if sessions is not None:
        out.add("sessions")
    if fixed_drafts:
        out.add("speculation")
    if cfg.prefix_host_blocks:
        out.add("prefix_tiers")
    if cfg.prefix_cache == "radix":
        out.add("radix")
    if client_timeout is not None:
        out.add("client_timeout")
    return out


def check_combination(features, capabilities: frozenset | None, plane: str | None, topology: str = "engine",
                      engine_cfg=None) -> None:
    """Refuse, in one line naming both, a feature the plane cannot serve, a feature that does not
    run in this topology, a pair of features that do not compose, or a feature missing a setting
    (a plane of None: before the planes are built, what does not depend on them)."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r} (one of {', '.join(TOPOLOGIES)})")
    names = sorted(set(features))
    unknown = [n for n in names if n not in FEATURES]
    if unknown:
        raise ValueError(f"unknown features {unknown} (known: {', '.join(FEATURES)})")
    if plane == "vllm" and topology != "engine":
        raise CombinationError(f"{TOPOLOGY_NAMES[topology]} and dataplane=vllm do not compose: dataplane=vllm "
                               "replays on one vLLM engine; clusters run on dataplane=sim or dataplane=torch")
    for name in names:
        f = FEATURES[name]
        if plane == "vllm" and not f.on_vllm:
            raise CombinationError(f"{name} and dataplane=vllm do not compose: vLLM's own engine runs every step "
                                   f"there, and {name} ({f.what.split(':')[0]}) is a feature of policylab's engine; "
                                   "replay on dataplane=sim or dataplane=torch")
        missing = sorted(c.value for c in f.needs - capabilities) if capabilities is not None else ()
        if plane != "vllm" and missing:
            raise CombinationError(f"{name} and dataplane={plane} do not compose: it needs the plane's "
                                   f"{', '.join(missing)}")
        if topology not in f.topologies:
            raise CombinationError(f"{name} and {TOPOLOGY_NAMES[topology]} do not compose: {name} runs on "
                                   f"{' or '.join(TOPOLOGY_NAMES[t] for t in f.topologies)}")
        for key, why in f.needs_config:
            if engine_cfg is not None and not getattr(engine_cfg, key):
                raise CombinationError(f"{name} and engine.{key}: {why}")
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            why = FEATURES[a].refuses.get(b) or FEATURES[b].refuses.get(a)
            if why:
                raise CombinationError(f"{a} and {b} do not compose: {why}")


def composes(features, capabilities: frozenset, plane: str, topology: str) -> str:
    """'' when the combination composes, else the one line that refuses it."""
    try:
        check_combination(features, capabilities, plane, topology)
    except CombinationError as e:
        return str(e)
    return ""


def composition_table(planes: dict) -> list:
    """Rows (feature a, feature b, plane, topology, verdict) for every pair of features (a == b: the
    feature alone) on every plane (`planes`: name -> capabilities) and topology; verdict is
    "composes" or the refusal's line."""
    names = list(FEATURES)
    rows = []
    for i, a in enumerate(names):
        for b in names[i:]:
            for plane, caps in planes.items():
                for topology in TOPOLOGIES:
                    why = composes({a, b}, caps, plane, topology)
                    rows.append((a, b, plane, topology, why or "composes"))
    return rows
