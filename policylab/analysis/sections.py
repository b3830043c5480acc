"""The summary's feature sections, declared once: which engine extension's record (`RunResult.
sections[source]`) becomes which section of summary.json, and how. One writer (`feature_sections`)
makes them all, in this order; the metric catalog declares every number a section holds, so the
printout, W&B and `compare` read them as any other metric."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from policylab.analysis.kv_hierarchy import kv_hierarchy_section
from policylab.analysis.program_metrics import program_summary
from policylab.analysis.session_metrics import session_summary
from policylab.cluster.result import ClusterResult
from policylab.core.extensions.forks import forks_summary
from policylab.core.extensions.speculation import spec_summary


@dataclass(frozen=True)
class SectionContext:
    """What a section is made from: the run, its request table, the summary's other numbers."""
    result: object
    requests: object              # the request table (pandas)
    summary: dict                 # the core numbers already computed (makespan, hit rate, ...)
    distribution: Callable


def _kv_hierarchy(c: SectionContext, record):
    scheduled = ~np.isnan(c.requests["first_scheduled_time"].to_numpy())
    return kv_hierarchy_section(c.result, c.requests["prompt_tokens"].to_numpy()[scheduled].sum(),
                                c.summary["prefix_cache_hit_rate"])


def _sessions(c: SectionContext, plan):
    return session_summary(c.requests, plan, c.distribution) if "session" in c.requests else None


def _speculative(c: SectionContext, stats):
    return spec_summary(stats)           # (none when no draft was ever verified)


def _forks(c: SectionContext, stats):
    result = c.result
    results = [p.result for p in result.replicas] if isinstance(result, ClusterResult) else [result]
    forks = [f for r in results for f in r.requests[len(r.trace):] if f is not None]
    return forks_summary(stats, result.requests[:len(result.trace)], forks, c.summary["makespan"])


def _programs(c: SectionContext, record):
    return program_summary(c.requests, c.result, c.distribution)


@dataclass(frozen=True)
class Section:
    source: str          # the extension's name: its record in RunResult.sections
    key: str             # the section of summary.json
    make: Callable       # (SectionContext, record) -> dict, or None when it has nothing to say


SECTIONS = (
    Section("kv_tiers", "kv_hierarchy", _kv_hierarchy),
    Section("sessions", "sessions", _sessions),
    Section("speculation", "speculative", _speculative),
    Section("forks", "forks", _forks),
    Section("tool_calls", "programs", _programs),
    Section("client_timeout", "client_timeout", lambda c, stats: dict(stats)),
    Section("migration", "migration", lambda c, stats: dict(stats)),
)


def feature_sections(context: SectionContext) -> dict:
    """summary.json's section of every extension the run had (in SECTIONS' order)."""
    out = {}
    for s in SECTIONS:
        record = context.result.sections.get(s.source)
        if record is not None:
            value = s.make(context, record)
            if value:
                out[s.key] = value
    return out
