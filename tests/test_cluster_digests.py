"""Cluster replays stay identical: every router's decisions and every request's outcome, on
generated traces, hash to a fixed table, as tests/test_replay_digests.py does for single replicas.

A digest covers, per request: the replica that admitted it, its decode replica, its KV transfer
time and decode-side KV wait, status and reason, first scheduled time, every token time, finish
time, preemptions and cached tokens; and every column of the merged step table (with `replica`).
The CLI cases hash requests.parquet and summary.json as test_replay_digests does (the results
stream and the cluster figures; tests/run_digest.py). A change that moves these on purpose updates the table here
and says why in its commit. `python tests/test_cluster_digests.py` prints the current table.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest

from policies.routers.least_loaded import LeastLoaded
from policies.routers.power_of_two import PowerOfTwo
from policies.routers.prefix_affinity import PrefixAffinity
from policies.routers.random import RandomRouter
from policies.routers.round_robin import RoundRobin
from policies.routers.session import Session
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.core.request import TraceRequest
from policylab.testing.cluster import build_cluster
from run_digest import replay_digest

ROUTERS = {"round_robin": RoundRobin, "least_loaded": LeastLoaded, "prefix_affinity": PrefixAffinity,
           "power_of_two": PowerOfTwo, "random": RandomRouter, "session": Session}
SMALL = EngineConfig(num_blocks=96, block_size=16, max_num_batched_tokens=512, max_num_seqs=16)

DIGESTS = {
    "4/round_robin/prefill_first/fixed": "d2cac00143896997",
    "4/round_robin/prefill_first/roofline": "80268bfa2e163fe3",
    "4/least_loaded/prefill_first/fixed": "3f96b5fe6bc4a619",
    "4/least_loaded/prefill_first/roofline": "d98a5aac5391b730",
    "4/prefix_affinity/prefill_first/fixed": "0f8726c227eca797",
    "4/prefix_affinity/prefill_first/roofline": "573146f6c7a13dbe",
    "4/power_of_two/prefill_first/fixed": "a8e9f070b4017e35",
    "4/power_of_two/prefill_first/roofline": "5c65fbd0df2923ff",
    "4/random/chunked/fixed": "78bed3d2156f0fa1",
    "4/session/decode_first/roofline": "de0fc9ce3b84e4b3",
    "4/least_loaded/chunked/roofline": "e1061b2d814775a2",
    "2+2/round_robin/prefill_first/fixed": "e60481ae2995c1aa",
    "2+2/least_loaded/chunked/roofline": "c006aa5d9047135a",
    "1+3/power_of_two/prefill_first/fixed": "22d13694d3348036",
    "4/round_robin/prefill_first/bench": "8585a689341bf3d4",
    "cli/1+2/round_robin/bursty": "e6850cf39d30928a",
    "cli/3/prefix_affinity/multitenant": "1a1b32019d7c243a",
}


def generated_trace(n=400, rate=120.0, seed=5) -> list:
    """Poisson arrivals, shared prefixes, a few clients; some prompts long enough to preempt."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    prefixes = ((), (7,), (7, 8), (9,), (9, 10, 11))
    return [TraceRequest(round(float(a), 6), int(rng.integers(20, 400)), int(rng.integers(1, 60)),
                         client=f"c{k % 4}", prefix_hashes=prefixes[k % len(prefixes)]) for k, a in enumerate(t)]


def conversation_trace(n=600, replicas=4) -> list:
    """bench_cluster.py's trace shape (conversation lengths, 5.5 req/s a replica)."""
    from policylab.traces.arrivals import ArrivalProcess
    from policylab.traces.generate import ClientSpec, generate_trace
    from policylab.traces.lengths import LengthDist
    client = ClientSpec("chat", ArrivalProcess("poisson", rate=5.5 * replicas),
                        LengthDist("lognormal", mean=1150, at=2400, max=6000),
                        LengthDist("lognormal", mean=210, at=450, max=2000))
    return generate_trace([client], n, 0)


def cluster_digest(result) -> str:
    h = hashlib.sha256()
    p = result.placement
    for i, r in enumerate(result.requests):
        row = (p["replica"][i], p["decode_replica"][i], p["transfer_time"][i], p["kv_wait"][i],
               r.status.value, r.reject_reason, r.first_scheduled_time, tuple(r.token_times), r.finish_time,
               r.num_preemptions, r.num_cached_tokens_total)
        h.update(repr(row).encode())
    for k in sorted(result.steps):
        h.update(k.encode())
        h.update(np.ascontiguousarray(result.steps[k]).tobytes())
    h.update(result.status.encode())
    return h.hexdigest()[:16]


def pinned(policy: str):
    """The policy spec the digests were recorded with (they predate prefill_first's watermark)."""
    if policy == "prefill_first":
        return {"_target_": "policies.prefill_first.PrefillFirst", "name": "prefill_first", "watermark": 0.0}
    return policy


def run_case(case: str):
    """`shape/router/policy/timing`: shape 4 (colocated replicas) or P+D; timing `fixed` (the tiny
    model at 4 ms a step: many simultaneous steps, so tie-breaking counts), `roofline` (Llama-3-8B
    on an H100, timed by the default cost model), or `bench` (bench_cluster.py's model, hardware, engine config and trace shape).
    Colocated runs preempt (96 blocks); P/D ones get 192 blocks and half the rate."""
    shape, router, policy, timing = case.split("/")
    policy = pinned(policy)
    if timing == "bench":
        return bench_cluster(conversation_trace(), policy, ROUTERS[router](), replicas=int(shape)).run()
    replicas, prefill, decode = (int(shape), 0, 0) if "+" not in shape else (0, *map(int, shape.split("+")))
    size = max(replicas, prefill + decode)
    hardware, model = (None, None) if timing == "fixed" else ([HardwareConfig()] * size, llama3_8b())
    cfg, rate = (SMALL, 120.0) if not prefill else (dataclasses.replace(SMALL, num_blocks=192), 60.0)
    return build_cluster(generated_trace(rate=rate), policy, ROUTERS[router], cfg, replicas=replicas,
                         prefill=prefill, decode=decode, decode_router_factory=LeastLoaded, hardware=hardware,
                         model=model).run()


def llama3_8b() -> ModelConfig:
    import yaml
    with open("configs/model/llama3-8b.yaml") as f:
        return ModelConfig(**yaml.safe_load(f))


def bench_cluster(trace, policy, router, replicas):
    from policylab.cluster import Cluster, Replica
    from policylab.dataplane.config import DataplaneConfig
    from policylab.core.engine import Engine
    from policylab.dataplane.sim import SimDataPlane
    from policylab.testing.loader import policy_factory
    model = llama3_8b()
    engines = [Engine(trace, policy_factory(policy)(), SimDataPlane(model, HardwareConfig(), DataplaneConfig(kind="sim")),
                      EngineConfig(), prefix_block_tokens=512) for _ in range(replicas)]
    return Cluster(trace, [Replica(i, "colocated", "h100", e) for i, e in enumerate(engines)], router)


CASES = [f"4/{r}/prefill_first/{t}" for r in ("round_robin", "least_loaded", "prefix_affinity", "power_of_two")
         for t in ("fixed", "roofline")] + [
    "4/random/chunked/fixed", "4/session/decode_first/roofline", "4/least_loaded/chunked/roofline",
    "2+2/round_robin/prefill_first/fixed", "2+2/least_loaded/chunked/roofline", "1+3/power_of_two/prefill_first/fixed",
    "4/round_robin/prefill_first/bench"]

CLI_CASES = {      # (the default policy, prefill_first, pinned to watermark 0 as its digests were recorded)
    "cli/3/prefix_affinity/multitenant": ["cluster.replicas=3", "router=prefix_affinity", "trace=multitenant",
                                          "policy.watermark=0"],
    "cli/1+2/round_robin/bursty": ["cluster.prefill_replicas=1", "cluster.decode_replicas=2", "trace=bursty",
                                   "policy.watermark=0"],
}


@pytest.mark.parametrize("case", CASES)
def test_cluster_replay_is_identical(case):
    result = run_case(case)
    assert result.status == "complete"
    assert cluster_digest(result) == DIGESTS[case]


@pytest.mark.parametrize("rows_per_group", [None, 64])
@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_cluster_job_is_identical(case, rows_per_group, tmp_path, monkeypatch):
    """Also with small row groups: results streamed (and requests forgotten) as the run goes."""
    if rows_per_group:
        import policylab.analysis.result_stream as stream
        monkeypatch.setattr(stream, "ROWS_PER_GROUP", rows_per_group)
        monkeypatch.setattr(stream, "STEPS_PER_GROUP", 4 * rows_per_group)
    assert cli_digest(case, tmp_path) == DIGESTS[case]


def cli_digest(case: str, run_dir) -> str:
    from policylab.apps.cli import main
    main(["run", *CLI_CASES[case], "dataplane=sim", "logger=none", "plots=false", "progress=false",
          f"hydra.run.dir={run_dir}"])
    return replay_digest(run_dir)


if __name__ == "__main__":
    import tempfile
    from pathlib import Path
    table = {case: cluster_digest(run_case(case)) for case in CASES}
    for case in sorted(CLI_CASES):
        with tempfile.TemporaryDirectory() as d:
            table[case] = cli_digest(case, Path(d))
    print(json.dumps(table, indent=4))
