"""Swap preemption: victims' KV moves to a host tier and back, the step pays the transfer, the
invariant harness holds across both tiers, and on the torch plane the tokens equal recompute's."""
from __future__ import annotations

import dataclasses
import json

import pytest

from policies.chunked import Chunked
from policylab.core.config import EngineConfig, check_engine_config
from policylab.core.request import TraceRequest
from policylab.core.kv.host import HostTier, TransferLink, make_link
from policylab.testing.harness import Scenario, run_checked
from policylab.testing.properties import InvariantViolation

pytestmark = pytest.mark.timeout(300)

TRACE = tuple(TraceRequest(arrival_time=0.01 * i, prompt_tokens=40 + 7 * i, output_tokens=30 + 3 * (i % 5))
              for i in range(12))
PRESSURE = EngineConfig(block_size=8, num_blocks=40, max_num_batched_tokens=128, max_num_seqs=8,
                        max_model_len=512, host_kv_blocks=64)


def replay(mode: str, engine: EngineConfig = PRESSURE, policy=None):
    return run_checked(policy or (lambda: Chunked(chunk_size=64, preempt_mode=mode)), Scenario(TRACE, engine))


def test_swap_resumes_instead_of_recomputing_with_the_same_tokens():
    recompute, swap = replay("recompute"), replay("swap")
    assert recompute.sections.get("kv_tiers")["recomputed_tokens"] > 0 and recompute.sections.get("kv_tiers")["swap_outs"] == 0
    stats = swap.sections.get("kv_tiers")
    assert stats["swap_outs"] > 0 and stats["swap_outs"] == stats["swap_ins"]
    # what is still in the device's prefix cache at swap-in is taken as hits, not copied back
    assert stats["swapped_out_blocks"] == stats["swapped_in_blocks"] + stats["swap_in_cached_blocks"]
    assert stats["swapped_in_blocks"] > 0 and stats["swap_in_cached_blocks"] > 0
    assert stats["recomputed_tokens"] == 0 and stats["transfer_time"] > 0
    for a, b in zip(recompute.requests, swap.requests):
        assert a.output_ids == b.output_ids          # the sim's ids depend on positions only
    prefill = lambda res: int(res.steps["prefill_tokens"].sum())
    assert prefill(swap) < prefill(recompute)


def test_a_small_host_tier_swaps_what_fits_and_recomputes_the_rest():
    result = replay("swap", dataclasses.replace(PRESSURE, host_kv_blocks=8))
    stats = result.sections.get("kv_tiers")
    assert stats["swap_outs"] > 0 and stats["recomputed_tokens"] > 0


def test_without_a_host_tier_swap_mode_is_refused_before_the_run():
    """preempt_mode=swap with nowhere to swap to would silently recompute: refused, naming both."""
    off = dataclasses.replace(PRESSURE, host_kv_blocks=0)
    with pytest.raises(ValueError, match="^swap and engine.host_kv_blocks: swap preemption needs a host tier"):
        replay("swap", off)
    assert "kv_tiers" not in replay("recompute", off).sections


class _SwapsEverything(Chunked):
    """Swaps every victim, ignoring the host tier's room (or whether it exists)."""

    def schedule(self, view):
        plan = super().schedule(view)
        plan.swap = list(plan.preempt)
        return plan


class _SwapsARunner(Chunked):
    """Swaps a running request it does not preempt."""

    def schedule(self, view):
        plan = super().schedule(view)
        plan.swap = [v.req_id for v in view.running if v.req_id not in plan.preempt][:1]
        return plan


@pytest.mark.parametrize("policy, host_blocks, rule", [
    (lambda: _SwapsEverything(chunk_size=64), 0, "swap_off"),
    (lambda: _SwapsEverything(chunk_size=64), 1, "host_capacity"),
    (lambda: _SwapsARunner(chunk_size=64), 64, "swap_preempted"),
])
def test_bad_swap_lists_break_the_contract(policy, host_blocks, rule):
    with pytest.raises(InvariantViolation, match=rule):
        replay("swap", dataclasses.replace(PRESSURE, host_kv_blocks=host_blocks), policy)


def test_the_step_that_moves_kv_pays_the_transfer():
    slow = dataclasses.replace(PRESSURE, swap_latency=1.0, swap_bandwidth=1e9)
    serial, overlapped = replay("swap", slow), replay("swap", dataclasses.replace(slow, swap_overlap=True))
    moving = {}
    for name, result in (("serial", serial), ("overlapped", overlapped)):
        d = result.steps["duration"]
        moving[name] = d[d >= 1.0]                 # computes take milliseconds: these steps moved KV
        assert len(moving[name]) > 0
    # overlapped: each such step lasts max(compute, transfer) = its transfer exactly
    assert abs(overlapped.sections.get("kv_tiers")["transfer_time"] - moving["overlapped"].sum()) < 1e-9
    # serial: compute + transfer, so more than the transfer alone
    assert moving["serial"].sum() > serial.sections.get("kv_tiers")["transfer_time"] > 1.0 * len(moving["serial"]) - 1e-9


def test_link_presets_and_overrides():
    pcie, c2c = make_link("pcie4", None, None, False), make_link("nvlink_c2c", None, None, True)
    assert pcie.transfer_time(10, 1e6) > c2c.transfer_time(10, 1e6) > 0
    assert pcie.transfer_time(0, 1e6) == 0.0
    assert TransferLink(1e9, 0.0, False).step_duration(0.5, 0.25) == 0.75
    assert TransferLink(1e9, 0.0, True).step_duration(0.5, 0.25) == 0.5
    assert make_link("pcie5", 2e9, 0.0, False).transfer_time(4, 1e9) == 2.0
    for bad, field in ((dict(swap_link="usb"), "engine.swap_link"), (dict(swap_bandwidth=0.0), "swap_bandwidth"),
                       (dict(swap_latency=-1.0), "swap_latency"), (dict(host_kv_blocks=-1), "host_kv_blocks")):
        with pytest.raises(ValueError, match=field):
            check_engine_config(EngineConfig(**bad))


def test_host_tier_accounting():
    host = HostTier(5)
    host.put(7, 3, None, 20)
    assert (host.num_used, host.num_free, host.blocks_of(7), host.tokens_of(7)) == (3, 2, 3, 20)
    with pytest.raises(MemoryError):
        host.put(8, 3, None, 20)
    assert host.take(7) is None and host.num_free == 5
    host.check()


def test_torch_plane_moves_blocks_to_cpu_and_greedy_tokens_equal_recompute():
    torch = pytest.importorskip("torch")
    from policylab.core.engine import Engine
    from policylab.dataplane.torch_plane import TorchDataPlane
    from tests.test_dataplane_model import SMALL, dataplane

    trace = [TraceRequest(arrival_time=0.0, prompt_tokens=p, output_tokens=o)
             for p, o in ((40, 8), (12, 10), (10, 9), (14, 7))]
    cfg = EngineConfig(block_size=4, num_blocks=20, max_num_batched_tokens=32, max_num_seqs=8,
                       max_model_len=256, check_invariants=True, host_kv_blocks=32)
    outputs, payloads = {}, []
    for mode in ("recompute", "swap"):
        plane = TorchDataPlane.from_config(dataplane(), SMALL, seed=0)
        if mode == "swap":
            export = plane.export_kv
            plane.export_kv = lambda table: payloads.append(export(table)) or payloads[-1]
        engine = Engine(trace, Chunked(chunk_size=32, preempt_mode=mode), plane, cfg, seed=0)
        result = engine.run()
        assert result.status == "complete", result.error
        assert sum(r.num_preemptions for r in result.requests) > 0
        outputs[mode] = [r.output_ids for r in result.requests]
        if mode == "swap":
            assert result.sections.get("kv_tiers")["swap_ins"] > 0 and result.sections.get("kv_tiers")["recomputed_tokens"] == 0
        else:
            assert result.sections.get("kv_tiers")["recomputed_tokens"] > 0
    assert payloads and all(isinstance(p, torch.Tensor) for p in payloads)
    assert outputs["swap"] == outputs["recompute"]
    assert all(len(o) == t.output_tokens for o, t in zip(outputs["swap"], trace))


def test_cli_run_with_swap_writes_the_kv_hierarchy(tmp_path):
    from policylab.apps.cli import main
    main(["run", "policy=chunked", "policy.preempt_mode=swap", "trace=poisson", "dataplane=sim", "logger=none",
          "plots=false", "progress=false", "engine.num_blocks=120", "engine.host_kv_blocks=2000",
          "engine.swap_link=nvlink_c2c", f"hydra.run.dir={tmp_path}"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    stats = summary["kv_hierarchy"]
    assert stats["swap_outs"] > 0 and stats["swap_ins"] == stats["swap_outs"]
    assert summary["counts"]["finished"] == summary["counts"]["requests"]
    from policylab.analysis.run_table import collect_runs
    table, _ = collect_runs([tmp_path])
    assert table["swap transfer (s)"].iloc[0] == pytest.approx(stats["transfer_time"])
    assert table["recomputed tokens"].iloc[0] == stats["recomputed_tokens"]


class _RejectsSwapped(Chunked):
    """Swaps victims, then rejects them while they wait on the host tier."""

    def schedule(self, view):
        plan = super().schedule(view)
        plan.reject.update({v.req_id: "swapped out too long" for v in view.waiting
                            if v.is_swapped and v.req_id not in plan.num_scheduled_tokens})
        return plan


def test_rejecting_a_swapped_request_frees_its_host_blocks():
    result = replay("swap", policy=lambda: _RejectsSwapped(chunk_size=64, preempt_mode="swap"))
    rejected = [r for r in result.requests if r.status.value == "rejected"]
    assert rejected and all(r.swapped_blocks == 0 for r in rejected)
    assert result.sections.get("kv_tiers")["swap_outs"] > result.sections.get("kv_tiers")["swap_ins"]   # (the harness checks no leak at drain)


def test_the_view_shows_the_host_tier_and_replace_keeps_it():
    seen = []

    class Watching(Chunked):
        def schedule(self, view):
            seen.append((view.num_free_host_blocks, view.num_total_host_blocks,
                         view.replace(step=-1).num_free_host_blocks,
                         sum(view.by_id[rid].num_host_blocks for rid in view.by_id)))
            return super().schedule(view)

    replay("swap", policy=lambda: Watching(chunk_size=64, preempt_mode="swap"))
    assert all(total == 64 and again == free and free + held == 64 for free, total, again, held in seen)
    assert any(held for *_, held in seen)


@pytest.mark.timeout(30)
def test_swap_in_copies_back_only_the_blocks_the_device_cache_lost():
    """Blocks still in the device's prefix cache at swap-in are hits, not copies: over a link with
    no latency the transfer time is exactly (blocks swapped out + blocks copied back) x the bytes
    of a block / the bandwidth, and the cached ones add nothing."""
    from policylab.core.config import ModelConfig
    bandwidth = 1e9
    result = replay("swap", dataclasses.replace(PRESSURE, swap_latency=0.0, swap_bandwidth=bandwidth))
    stats = result.sections.get("kv_tiers")
    assert stats["swap_in_cached_blocks"] > 0 and stats["swapped_in_blocks"] > 0   # both kinds occur
    m = ModelConfig()
    head_dim = m.head_dim or m.hidden_size // m.num_attention_heads
    block_bytes = 2 * m.num_hidden_layers * m.num_key_value_heads * head_dim * m.dtype_bytes * PRESSURE.block_size
    copied = stats["swapped_out_blocks"] + stats["swapped_in_blocks"]
    assert stats["transfer_time"] == pytest.approx(copied * block_bytes / bandwidth, rel=1e-12)
