"""The prefix cache's host and disk tiers: blocks the device evicts are offloaded, a lower-tier hit
is promoted and pays its transfer, both prefix indexes take them, the invariant harness holds on
every tier, and on the torch plane the KV really moves (CPU tensors, a memory-mapped file) with
greedy tokens unchanged."""
from __future__ import annotations

import dataclasses
import json

import pytest

from policies.chunked import Chunked
from policylab.core.config import EngineConfig, check_engine_config
from policylab.core.kv.tiers import DiskStore, TierStore
from policylab.core.request import TraceRequest
from policylab.testing.harness import Scenario, run_checked
from policylab.testing.kv_traces import mooncake_style

pytestmark = pytest.mark.timeout(300)

TRACE = mooncake_style(80, seed=3, rate=60.0, segment=32, groups=6, max_depth=6)
PRESSURE = EngineConfig(block_size=8, num_blocks=90, max_num_batched_tokens=128, max_num_seqs=8,
                        max_model_len=1024)


def replay(engine: EngineConfig, trace=TRACE, **tiers):
    return run_checked(lambda: Chunked(chunk_size=64), Scenario(trace, dataclasses.replace(engine, **tiers),
                                                                prefix_block_tokens=32))


def cached_tokens(result) -> int:
    return sum(r.num_cached_tokens_total for r in result.requests)


@pytest.mark.parametrize("index", ["hash", "radix"])
def test_lower_tiers_turn_evictions_into_hits(index):
    device = replay(PRESSURE, prefix_cache=index)
    host = replay(PRESSURE, prefix_cache=index, prefix_host_blocks=40)
    both = replay(PRESSURE, prefix_cache=index, prefix_host_blocks=20, prefix_disk_blocks=60)
    assert device.sections.get("kv_tiers") is None
    assert cached_tokens(device) < cached_tokens(host) < cached_tokens(both)
    h, d = host.sections.get("kv_tiers"), both.sections.get("kv_tiers")
    assert h["host_hit_blocks"] > 0 and h["disk_hit_blocks"] == 0 and h["dropped_blocks"] > 0
    assert d["host_hit_blocks"] > 0 and d["disk_hit_blocks"] > 0 and d["disk_offloaded_blocks"] > 0
    # every promoted block was offloaded first, and every offloaded one is still below, promoted, superseded or dropped
    for s, tiers in ((h, (40, 0)), (d, (20, 60))):
        promoted = s["host_hit_blocks"] + s["disk_hit_blocks"]
        below = s["host_offloaded_blocks"] - promoted - s["dropped_blocks"] - s["superseded_blocks"]
        assert 0 <= below <= sum(tiers)
        assert s["host_hit_tokens"] == 8 * s["host_hit_blocks"]
        assert s["host_bytes"] > 0 and s["host_transfer_time"] > 0
    assert d["disk_bytes"] > 0 and d["disk_transfer_time"] > 0 and h["disk_transfer_time"] == 0
    for a, b in zip(device.requests, both.requests):
        assert a.output_ids == b.output_ids          # the sim's ids depend on positions only


def test_tiers_that_never_receive_a_block_change_nothing():
    ample = dataclasses.replace(PRESSURE, num_blocks=4000)
    off, on = replay(ample), replay(ample, prefix_host_blocks=64, prefix_disk_blocks=64)
    assert on.sections.get("kv_tiers")["host_offloaded_blocks"] == 0
    for k in ("clock", "duration", "prefill_tokens", "kv_used_blocks"):
        assert list(off.steps[k]) == list(on.steps[k]), k


def test_a_lower_tier_hit_costs_its_transfer_overlapped_or_not():
    slow = dataclasses.replace(PRESSURE, swap_latency=1.0, swap_bandwidth=1e9, prefix_host_blocks=40)
    serial, overlapped = replay(slow), replay(slow, swap_overlap=True)
    for result in (serial, overlapped):
        assert result.sections.get("kv_tiers")["host_hit_blocks"] > 0
    d = overlapped.steps["duration"]
    assert abs(overlapped.sections.get("kv_tiers")["host_transfer_time"] - d[d >= 1.0].sum()) < 1e-9   # max(compute, transfer)
    d = serial.steps["duration"]
    assert d[d >= 1.0].sum() > serial.sections.get("kv_tiers")["host_transfer_time"]                  # compute + transfer
    assert serial.steps["clock"][-1] > replay(PRESSURE, prefix_host_blocks=40).steps["clock"][-1] + 10


def test_tier_stores_are_lru_and_conserve_slots():
    store = TierStore("host", 2)
    assert store.put(1, "a") is None and store.put(2, "b") is None
    assert store.put(3, "c") == (1, "a")               # full: the least recently put one goes
    assert store.take(2) == "b" and 2 not in store and len(store) == 1 and store.num_free == 1
    store.check()
    disk = DiskStore(3, None)
    assert disk.put(5, None) is None and disk.take(5) is None
    disk.check()


@pytest.mark.parametrize("bad, field", [(dict(prefix_host_blocks=-1), "prefix_host_blocks"),
                                        (dict(prefix_disk_blocks=4), "prefix_disk_blocks"),
                                        (dict(prefix_host_blocks=4, prefix_disk="floppy"), "prefix_disk"),
                                        (dict(prefix_host_blocks=4, enable_prefix_caching=False),
                                         "enable_prefix_caching")])
def test_bad_tier_settings_name_their_key(bad, field):
    with pytest.raises(ValueError, match=field):
        check_engine_config(EngineConfig(**bad))


def test_torch_plane_moves_blocks_to_cpu_and_disk_with_the_same_greedy_tokens(tmp_path):
    torch = pytest.importorskip("torch")
    from policylab.core.engine import Engine
    from policylab.dataplane.torch_plane import TorchDataPlane
    from tests.test_dataplane_model import SMALL, dataplane

    shared = (11, 12, 13)           # three 8-token segments every third request shares
    trace = [TraceRequest(arrival_time=0.05 * i, prompt_tokens=24 + 4 * (i % 3), output_tokens=4 + i % 3,
                          prefix_hashes=shared if i % 3 == 0 else (100 + i, 200 + i, 300 + i))
             for i in range(12)]
    base = EngineConfig(block_size=4, num_blocks=14, max_num_batched_tokens=32, max_num_seqs=2,
                        max_model_len=256, check_invariants=True)
    outputs, payloads = {}, []
    for name, tiers in (("off", {}), ("host", dict(prefix_host_blocks=24)),
                        ("disk", dict(prefix_host_blocks=3, prefix_disk_blocks=24, prefix_disk_path=str(tmp_path)))):
        plane = TorchDataPlane.from_config(dataplane(), SMALL, seed=0)
        if tiers:
            export = plane.export_kv
            plane.export_kv = lambda table: payloads.append(export(table)) or payloads[-1]
        engine = Engine(trace, Chunked(chunk_size=32), plane, dataclasses.replace(base, **tiers), seed=0,
                        prefix_block_tokens=8)
        result = engine.run()
        assert result.status == "complete", result.error
        outputs[name] = [r.output_ids for r in result.requests]
        if name == "host":
            assert result.sections.get("kv_tiers")["host_hit_blocks"] > 0
        if name == "disk":
            assert result.sections.get("kv_tiers")["disk_hit_blocks"] > 0
            disk = engine.kv.tiers.disk._file
            assert isinstance(disk, torch.Tensor) and disk.shape[0] == 24   # the file-backed slots
            assert not list(tmp_path.iterdir())        # (unlinked once mapped: nothing left behind)
    assert payloads and all(p.device.type == "cpu" for p in payloads)
    assert outputs["host"] == outputs["off"] and outputs["disk"] == outputs["off"]
    assert all(len(o) == t.output_tokens for o, t in zip(outputs["off"], trace))


def test_the_vllm_data_plane_refuses_the_tiers_in_one_line():
    from policylab.core.config import ModelConfig
    from policylab.dataplane.config import DataplaneConfig
    from policylab.integrations.vllm.replay import setup_from_config
    with pytest.raises(ValueError, match="engine.prefix_host_blocks=8: dataplane=vllm keeps its prefix cache"):
        setup_from_config(EngineConfig(prefix_host_blocks=8), ModelConfig(), DataplaneConfig(kind="vllm"))


def test_cli_run_writes_per_tier_hit_rates_and_compare_shows_them(tmp_path):
    from policylab.analysis.metric_catalog import lookup
    from policylab.analysis.run_table import collect_runs
    from policylab.apps.cli import main
    from tests.test_metric_catalog import numbers
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 40 * t.arrival_time * 1000, "input_length": t.prompt_tokens,
                                         "output_length": t.output_tokens, "hash_ids": list(t.prefix_hashes)}) + "\n"
                             for t in TRACE))
    main(["run", "policy=chunked", "trace=mooncake", f"trace.path={trace}", "trace.prefix_block_tokens=32",
          "dataplane=sim", "logger=none", "plots=false", "progress=false", "engine.block_size=8",
          "engine.num_blocks=90", "engine.prefix_host_blocks=20", "engine.prefix_disk_blocks=60",
          f"hydra.run.dir={tmp_path / 'run'}"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    s = summary["kv_hierarchy"]
    assert s["host_hit_rate"] > 0 and s["disk_hit_rate"] > 0 and s["device_hit_rate"] > 0
    assert s["device_hit_rate"] + s["host_hit_rate"] + s["disk_hit_rate"] == pytest.approx(
        summary["prefix_cache_hit_rate"])
    for key in numbers(summary):
        lookup(key)                       # every number of the section is declared (and documented)
    table, _ = collect_runs([tmp_path / "run"])
    assert table["host hit (%)"].iloc[0] == pytest.approx(100 * s["host_hit_rate"])
    assert table["disk-tier transfer (s)"].iloc[0] == pytest.approx(s["disk_transfer_time"])


def test_a_cluster_sums_its_replicas_tiers_and_keeps_each_one(tmp_path):
    from policylab.apps.cli import main
    main(["run", "policy=chunked", "trace=multitenant", "trace.max_requests=120", "dataplane=sim", "logger=none",
          "plots=false", "progress=false", "cluster.replicas=2", "router=round_robin", "engine.num_blocks=60",
          "engine.prefix_host_blocks=200", f"hydra.run.dir={tmp_path}"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    total, parts = summary["kv_hierarchy"], [r["kv_hierarchy"] for r in summary["cluster"]["replicas"].values()]
    assert len(parts) == 2 and all(p["host_offloaded_blocks"] > 0 for p in parts)
    for key in ("host_hit_blocks", "host_offloaded_blocks", "host_bytes", "host_transfer_time"):
        assert total[key] == pytest.approx(sum(p[key] for p in parts)), key
    assert total["host_hit_blocks"] > 0 and 0 < total["host_hit_rate"] < 1


def test_cluster_invariants_hold_with_tiers_on_every_replica():
    from policies.routers.round_robin import RoundRobin
    from policylab.testing.cluster import build_cluster, check_cluster
    cfg = dataclasses.replace(PRESSURE, prefix_host_blocks=16, prefix_disk_blocks=16)
    result = check_cluster(lambda: build_cluster(TRACE, lambda: Chunked(chunk_size=64), RoundRobin, cfg,
                                                 replicas=2, checked=True))
    assert sum(p.result.sections.get("kv_tiers")["host_hit_blocks"] + p.result.sections.get("kv_tiers")["disk_hit_blocks"]
               for p in result.replicas) > 0


def test_two_requests_hitting_one_offloaded_prefix_in_a_step_share_one_promotion():
    shared = (1, 2, 3)                              # 3 segments of 32 tokens = 12 blocks of 8
    trace = (TraceRequest(arrival_time=0.0, prompt_tokens=100, output_tokens=2, prefix_hashes=shared),
             *(TraceRequest(arrival_time=0.5 + 0.1 * i, prompt_tokens=100, output_tokens=2,
                            prefix_hashes=(10 + i, 20 + i, 30 + i)) for i in range(4)),
             *(TraceRequest(arrival_time=2.0, prompt_tokens=100, output_tokens=2, prefix_hashes=shared)
               for _ in range(2)))
    cfg = dataclasses.replace(PRESSURE, num_blocks=30, prefix_host_blocks=64)
    result = replay(cfg, trace)
    assert result.sections.get("kv_tiers")["host_hit_blocks"] == 12 and result.sections.get("kv_tiers")["host_offloaded_blocks"] >= 12
    late = result.requests[-2:]
    assert [r.num_cached_tokens_total for r in late] == [96, 96]
    assert late[0].first_scheduled_time == late[1].first_scheduled_time     # (the same step)
    off = replay(dataclasses.replace(cfg, prefix_host_blocks=0), trace)
    assert off.requests[-2].num_cached_tokens_total == 0          # evicted: lost without the tier
