"""`trace.load=0.8`: the arrival rate as a fraction of the configuration's estimated capacity.

`trace.rate_scale` multiplies a trace's own rate, a unit that means nothing until a sweep has
found where policies differ. `trace.load` is the unit a queueing model speaks: the offered
load ρ = λ / μ, where μ is the rate at which this configuration can complete the trace's
requests. It is resolved to a rate scale before the run (`rate_scale = load · μ / λ₀`, λ₀ the
trace's own rate) and written with the run's summary (`load`: the fraction, μ, λ₀, the scale).

μ is estimated, not searched for: the trace's requests all arrive at once and are served by
`chunked` (Sarathi-Serve's stall-free batching: the batch stays full) on the simulator of the
run's model and hardware (the run's own cost model: its sim plane, or the cost model that times
a real plane's steps); μ = the completions per second between the 10th and the 90th percentile
of completions, the engine's steady throughput once the queue is full. The estimate depends on
the trace's lengths, the model, the hardware, the engine's limits and the cluster, never on the
policy under test: every policy at `trace.load=0.8` sees the same arrivals. Replicates
(`trace.replicate`) share the rate scale of the trace as read. One replay of the sim, cached
under the download cache (`$POLICYLAB_CACHE/capacity/`, one small JSON per configuration).
Load 1 is saturation: queues grow without bound at ≥ 1; where policies differ is usually 0.6–0.95.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
from pathlib import Path

from policylab.apps.config import RunConfig
from policylab.apps.jobs import RunError

REFERENCE_POLICY = {"_target_": "policies.chunked.Chunked", "name": "chunked", "chunk_size": 512}
ESTIMATE_VERSION = 1            # bump when the estimate changes: cached estimates are then recomputed
WINDOW = (0.1, 0.9)             # completions between these quantiles measure the steady throughput
ALL_AT_ONCE_S = 1e-6            # the trace's arrivals squeezed into this span: every request queued


def resolve_load(cfg: RunConfig, verbose: bool = True) -> tuple[RunConfig, dict | None]:
    """`cfg` with `trace.rate_scale` set from `trace.load` (unchanged without one), and the
    summary's `load` section (None without one); `verbose`: say so in one line."""
    load = cfg.trace.load
    if load is None:
        return cfg, None
    if not (isinstance(load, (int, float)) and math.isfinite(load) and load > 0):
        raise RunError(f"trace.load={load:g}: expected a fraction of the estimated capacity > 0 (e.g. 0.8)")
    if cfg.trace.sessions or cfg.trace.concurrency:
        raise RunError("trace.load sets an open-loop arrival rate; closed-loop sessions (trace.sessions, "
                       "trace.concurrency) pace themselves: leave trace.load out")
    estimate = capacity_estimate(cfg)
    scale = load * estimate["capacity_rate"] / estimate["trace_rate"]
    if cfg.trace.rate_scale != 1.0:
        print(f"note: trace.load={load:g} sets the rate scale ({scale:.4g}); trace.rate_scale="
              f"{cfg.trace.rate_scale:g} is not used", file=sys.stderr)
    report = {"fraction": float(load), "capacity_rate": estimate["capacity_rate"],
              "trace_rate": estimate["trace_rate"], "rate_scale": scale, "estimate": estimate["method"]}
    if verbose:
        print(f"trace.load={load:g}: {load:.0%} of an estimated capacity of {estimate['capacity_rate']:.3f} req/s, "
              f"the trace at {scale:.4g}× its rate of {estimate['trace_rate']:.3f} req/s"
              + (" (estimate cached)" if estimate.get("cached") else ""), file=sys.stderr)
    return dataclasses.replace(cfg, trace=dataclasses.replace(cfg.trace, rate_scale=scale)), report


def capacity_estimate(cfg: RunConfig) -> dict:
    """{capacity_rate, trace_rate (req/s), method, cached}: from the cache, else one sim replay."""
    key = estimate_key(cfg)
    path = cache_dir(cfg) / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"
    try:
        cached = json.loads(path.read_text())
        if cached.get("key") == key:
            return {**cached, "cached": str(path)}
    except (OSError, ValueError):
        pass
    found = saturation_throughput(cfg)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        part.write_text(json.dumps({**found, "key": key}, indent=1) + "\n")
        part.replace(path)                        # (jobs side by side: each writes a whole file)
    except OSError as e:
        print(f"note: capacity estimate not cached ({e}); it is recomputed next time", file=sys.stderr)
    return {**found, "cached": ""}


def cache_dir(cfg: RunConfig) -> Path:
    from policylab.datasets.cache import cache_root
    return cache_root(cfg.trace.cache_dir) / "capacity"


def base_trace(cfg: RunConfig):
    """The trace as read: at its own rate, once, no bootstrap replicate, no load."""
    return dataclasses.replace(cfg.trace, load=None, rate_scale=1.0, replicate=0, repeat=1)


def twin_plane(dataplane):
    """The sim plane that estimates a plane's capacity: the sim itself, or the cost model that times
    a real plane's steps (its `model_timing`), or the default sim."""
    from policylab.dataplane.config import SimPlaneConfig
    if isinstance(dataplane, SimPlaneConfig):
        return dataplane
    if hasattr(dataplane, "model_timing"):
        return dataplane.model_timing()
    return SimPlaneConfig(calibration=getattr(dataplane, "calibration", None))


def estimate_key(cfg: RunConfig) -> str:
    """Everything the estimate depends on, as canonical JSON (the trace file by size and time)."""
    from policylab.traces.load import resolve_path
    trace = base_trace(cfg)
    try:
        source = resolve_path(trace.path, trace.dataset, trace.cache_dir)
        stat = source.stat()
        file = [str(source.resolve()), stat.st_size, stat.st_mtime_ns]
    except Exception:                   # (the replay itself says what is wrong with the path)
        file = [str(trace.path)]
    parts = {"version": ESTIMATE_VERSION, "trace": dataclasses.asdict(trace), "file": file, "seed": cfg.seed,
             "model": dataclasses.asdict(cfg.model), "hardware": dataclasses.asdict(cfg.hardware),
             "engine": dataclasses.asdict(cfg.engine), "cluster": dataclasses.asdict(cfg.cluster),
             "router": cfg.router, "decode_router": cfg.decode_router,
             "plane": dataclasses.asdict(twin_plane(cfg.dataplane))}
    return json.dumps(parts, sort_keys=True, default=str)


def saturation_throughput(cfg: RunConfig) -> dict:
    """Replay the trace, every request arriving at once, under `chunked` on the sim twin; the
    completions per second between the WINDOW quantiles of completion times."""
    import logging
    log = logging.getLogger("policylab.traces")
    level, log.level = log.level, logging.WARNING        # (the run itself reports the trace it reads)
    try:
        return _saturation_throughput(cfg)
    finally:
        log.setLevel(level)


def _saturation_throughput(cfg: RunConfig) -> dict:
    from policylab.apps.jobs import build_engine, replay
    from policylab.core.request import Status
    from policylab.traces import load_trace
    trace_cfg = base_trace(cfg)
    arrivals = [t.arrival_time for t in load_trace(trace_cfg, seed=cfg.seed)]
    span = max(arrivals) - min(arrivals) if arrivals else 0.0
    if len(arrivals) < 2 or span <= 0:
        raise RunError(f"trace.load: the trace's {len(arrivals)} arrivals span no time, so it has no rate to "
                       "scale; use trace.rate_scale")
    trace_rate = len(arrivals) / span
    flood = dataclasses.replace(trace_cfg, rate_scale=span / ALL_AT_ONCE_S)
    clusters = dataclasses.replace(cfg.cluster, prefill_policy=None, decode_policy=None)
    twin = dataclasses.replace(cfg, trace=flood, policy=dict(REFERENCE_POLICY), dataplane=twin_plane(cfg.dataplane),
                               speculative=type(cfg.speculative)(), cluster=clusters)
    engine = build_engine(twin, trace=load_trace(flood, seed=cfg.seed))
    result = replay(engine, progress=False)
    done = sorted(r.finish_time for r in result.requests if r is not None and r.status is Status.FINISHED)
    if result.partial or len(done) < 2:
        why = result.error or "no request finished"
        raise RunError(f"trace.load: the capacity estimate's replay did not complete ({why}); use trace.rate_scale")
    first, last = int(WINDOW[0] * (len(done) - 1)), int(math.ceil(WINDOW[1] * (len(done) - 1)))
    if done[last] <= done[first]:
        first, last = 0, len(done) - 1
    capacity = (last - first) / (done[last] - done[first]) if done[last] > done[first] else len(done) / done[-1]
    plane = twin.dataplane
    model, hardware = cfg.model.name, cfg.hardware.name
    method = (f"steady throughput of chunked with all {len(arrivals)} requests queued, on the sim "
              f"({getattr(plane, 'cost_model', 'sim')} cost model) of {model} on {hardware}")
    return {"capacity_rate": capacity, "trace_rate": trace_rate, "method": method}
