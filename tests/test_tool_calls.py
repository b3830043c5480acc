"""Tool calls: requests pause mid-generation, their KV kept, freed or offloaded as the policy (or
engine.tool_kv) chooses, and resume with the tool's tokens; traces carry the calls, program
metrics count the tools' time apart from serving time."""
from __future__ import annotations

import dataclasses
import json
from collections import Counter

import numpy as np
import pytest

from policies.chunked import Chunked
from policies.plas import ProgramLeastAttainedService
from policylab.analysis.results import summarize_run
from policylab.core.config import EngineConfig
from policylab.core.request import TraceRequest
from policylab.core.extensions.tool_calls import ToolCall, check_tool_calls, tool_result_ids
from policylab.testing.harness import Scenario, check_policy, run_checked
from policylab.testing.properties import InvariantViolation
from policylab.traces.errors import TraceError
from policylab.traces.native import read_native, write_native
from policylab.traces.tool_calls import add_tool_calls

pytestmark = pytest.mark.timeout(300)

CFG = EngineConfig(block_size=8, num_blocks=48, max_num_batched_tokens=128, max_num_seqs=8,
                   max_model_len=1024, host_kv_blocks=48)
TRACE = tuple(TraceRequest(arrival_time=0.004 * i, prompt_tokens=30 + 9 * i, output_tokens=24 + 2 * i,
                           tool_calls=(ToolCall(6, 0.05 + 0.01 * i, 10), ToolCall(15, 0.2, 7)) if i % 3 else ())
              for i in range(10))


def replay(mode: str, cfg: EngineConfig = CFG, policy=None, trace=TRACE):
    return run_checked(policy or (lambda: Chunked(chunk_size=64)),
                       Scenario(trace, dataclasses.replace(cfg, tool_kv=mode)))


@pytest.mark.parametrize("mode", ["keep", "free", "offload"])
def test_each_forced_kv_choice_pauses_every_call_and_finishes_with_the_tool_tokens(mode):
    result = replay(mode)
    stats = result.sections.get("tool_calls").stats
    calls = sum(len(t.tool_calls) for t in TRACE)
    assert result.status == "complete" and stats["tool_calls"] == calls
    chosen = {"keep": "kept", "free": "freed", "offload": "offloaded"}[mode]
    assert stats[chosen] + (stats["offload_fallbacks"] if mode == "offload" else 0) == calls
    assert (stats["recomputed_tokens"] > 0) == (mode != "keep")
    for t, r in zip(TRACE, result.requests):
        tools = sum(c.result_tokens for c in t.tool_calls)
        assert len(r.token_times) == t.output_tokens                    # model tokens, as the trace says
        assert len(r.output_ids) == t.output_tokens + tools              # plus the tools' tokens
        for k, c in enumerate(t.tool_calls):                             # each result right after its call
            at = c.after_tokens + sum(x.result_tokens for x in t.tool_calls[:k])
            want = tool_result_ids(0, r.req_id, k, c.result_tokens, 32000).tolist()
            assert r.output_ids[at:at + c.result_tokens] == want
            assert r.token_times[c.after_tokens] - r.token_times[c.after_tokens - 1] >= c.duration_s


def test_keeping_kv_recomputes_nothing_and_freeing_recomputes_the_context():
    keep, free = replay("keep"), replay("free")
    assert keep.sections.get("tool_calls").stats["recomputed_tokens"] == 0
    lost = free.sections.get("tool_calls").stats["recomputed_tokens"]
    assert lost == sum(p[2] for p in free.sections.get("tool_calls").per_request.values()) > 0
    assert [r.output_ids for r in keep.requests] == [r.output_ids for r in free.requests]


def test_offload_uses_the_host_tier_and_pays_its_transfer():
    result = replay("offload")
    assert result.sections.get("tool_calls").stats["offloaded"] > 0 and result.sections.get("kv_tiers")["swap_ins"] == result.sections.get("tool_calls").stats["offloaded"]
    assert result.sections.get("kv_tiers")["transfer_time"] > 0
    small = replay("offload", dataclasses.replace(CFG, host_kv_blocks=4))
    assert small.sections.get("tool_calls").stats["offload_fallbacks"] > 0                 # no room: freed instead


def test_offload_without_a_host_tier_and_a_bad_mode_are_config_errors():
    with pytest.raises(ValueError, match="engine.tool_kv=offload needs a host tier"):
        replay("offload", dataclasses.replace(CFG, host_kv_blocks=0))
    with pytest.raises(ValueError, match="engine.tool_kv must be one of"):
        replay("sometimes")


class _Chooses(Chunked):
    def __init__(self, choice):
        super().__init__(chunk_size=64)
        self.choice, self.asked = choice, []

    def on_tool_call(self, view, request, call):
        assert request.status == "running" and call in TRACE[request.req_id].tool_calls
        self.asked.append((request.req_id, call))
        return self.choice


def test_the_policy_hook_decides_unless_the_config_forces_a_choice():
    policy = _Chooses("free")
    result = replay("policy", policy=lambda: policy)
    assert len(policy.asked) == result.sections.get("tool_calls").stats["tool_calls"] == result.sections.get("tool_calls").stats["freed"]
    forced = _Chooses("free")
    result = replay("keep", policy=lambda: forced)
    assert not forced.asked and result.sections.get("tool_calls").stats["kept"] == result.sections.get("tool_calls").stats["tool_calls"]
    with pytest.raises(InvariantViolation, match="tool_kv"):
        replay("policy", policy=lambda: _Chooses("discard"))


def test_the_default_hook_offloads_if_it_can_else_keeps_when_nobody_waits_else_frees():
    alone = (TraceRequest(0.0, 40, 30, tool_calls=(ToolCall(10, 0.5, 5),)),)
    assert replay("policy", trace=alone).sections["tool_calls"].stats["offloaded"] == 1
    no_host = dataclasses.replace(CFG, host_kv_blocks=0)
    assert replay("policy", no_host, trace=alone).sections["tool_calls"].stats["kept"] == 1
    crowd = alone + tuple(TraceRequest(0.001, 300, 30) for _ in range(12))   # they wait behind it
    stats = replay("policy", dataclasses.replace(no_host, max_num_seqs=1), trace=crowd).sections["tool_calls"].stats
    assert stats["freed"] == 1


def test_latencies_exclude_tool_time_and_jct_includes_it():
    requests, _, summary = summarize_run(replay("keep"))
    called = requests["tool_calls"].to_numpy() > 0
    paused = np.array([sum(c.duration_s for c in t.tool_calls) for t in TRACE])
    assert np.allclose(requests["tool_time"], paused)
    assert np.allclose(requests["jct"] - requests["e2e"], paused)
    assert (requests["generated_tokens"] == [t.output_tokens for t in TRACE]).all()
    assert summary["itl"]["max"] < min(c.duration_s for t in TRACE for c in t.tool_calls)
    tpot = (requests["e2e"] - requests["ttft"]) / (requests["generated_tokens"] - 1)
    assert np.allclose(requests["tpot"], tpot)
    p = summary["programs"]
    assert p["tool_calls"] == sum(len(t.tool_calls) for t in TRACE) and p["programs_with_calls"] == called.sum()
    assert p["jct"]["max"] == pytest.approx(requests["jct"].max())
    assert p["tool_time"]["mean"] == pytest.approx(paused[called].mean())


def test_a_run_without_tool_calls_has_no_program_metrics():
    plain = tuple(dataclasses.replace(t, tool_calls=()) for t in TRACE)
    result = replay("policy", trace=plain)
    assert result.sections.get("tool_calls") is None
    requests, _, summary = summarize_run(result)
    assert "programs" not in summary and "jct" not in requests.columns


def test_plas_is_shipped_so_the_invariant_suite_checks_it():
    """(test_invariants_with_tool_calls runs for every shipped policy config)"""
    from policylab.testing.loader import shipped_policy_configs
    assert any(s.endswith("plas.yaml") for s in shipped_policy_configs())


def test_plas_admits_the_program_with_less_service_first():
    """A long program back from its tool and a new short one wait for the one sequence slot: FCFS
    (chunked) takes the long one, that arrived first; PLAS the short one, that has had no service."""
    trace = (TraceRequest(0.0, 400, 40, tool_calls=(ToolCall(5, 0.02, 8),)),
             TraceRequest(0.0005, 40, 200), TraceRequest(0.001, 40, 10))
    cfg = EngineConfig(block_size=8, num_blocks=200, max_num_batched_tokens=64, max_num_seqs=1, max_model_len=1024)
    order = {}
    for name, make in (("fcfs", lambda: Chunked(chunk_size=64)),
                       ("plas", lambda: ProgramLeastAttainedService(chunk_size=64, quantum=32))):
        long, _, short = check_policy(make, Scenario(trace, cfg), determinism=False).requests
        order[name] = short.finish_time < long.finish_time
    assert order == {"fcfs": False, "plas": True}


# ------------------------------------------------------------------ traces
def test_native_tool_calls_round_trip(tmp_path):
    path = tmp_path / "t.jsonl"
    write_native(path, TRACE)
    back = [TraceRequest(*raw) for raw in read_native(path, str(path), Counter())]
    assert [t.tool_calls for t in back] == [t.tool_calls for t in TRACE]


@pytest.mark.parametrize("calls, field, message", [
    ([{"after_tokens": 5, "duration_s": 1.0}], "tool_calls[0].result_tokens", "missing"),
    ([{"after_tokens": 5, "duration_s": 1.0, "result_tokens": 3, "x": 1}], "tool_calls[0].x", "unknown key"),
    ([{"after_tokens": 5, "duration_s": 1, "result_tokens": 3}, {"after_tokens": 5, "duration_s": 1,
      "result_tokens": 3}], "tool_calls[1].after_tokens", "after the previous call"),
    ([{"after_tokens": 20, "duration_s": 1, "result_tokens": 3}], "tool_calls[0].after_tokens", "before the last"),
    ([{"after_tokens": 5, "duration_s": -1, "result_tokens": 3}], "tool_calls[0].duration_s", "seconds >= 0"),
    ([{"after_tokens": 5, "duration_s": 1, "result_tokens": 0}], "tool_calls[0].result_tokens", "positive"),
    ({"after_tokens": 5}, "tool_calls", "a list of calls"),
])
def test_bad_tool_calls_name_file_line_and_field(tmp_path, calls, field, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"arrival_time": 0, "prompt_tokens": 5, "output_tokens": 20}) + "\n" +
                    json.dumps({"arrival_time": 1, "prompt_tokens": 5, "output_tokens": 20, "tool_calls": calls}) + "\n")
    with pytest.raises(TraceError) as e:
        list(read_native(path, "bad.jsonl", Counter()))
    assert e.value.line == 2 and e.value.field == field and message in str(e.value)
    assert str(e.value).startswith(f"bad.jsonl:2: field '{field}'")


def test_programmatic_traces_are_checked_too():
    with pytest.raises(ValueError, match=r"trace request 0: tool_calls\[0\].after_tokens=30 must be < output_tokens=30"):
        replay("keep", trace=(TraceRequest(0.0, 10, 30, tool_calls=(ToolCall(30, 1.0, 4),)),))
    with pytest.raises(ValueError, match="must be a ToolCall"):
        check_tool_calls(({"after_tokens": 1},), 10, "here")


def test_the_transform_adds_seeded_calls_to_any_trace():
    outputs = [1, 2, 10, 50, 300]
    spec = {"calls": 3, "duration_s": 2.0, "result_tokens": 16}
    a = add_tool_calls(outputs, spec, np.random.default_rng(0))
    assert a == add_tool_calls(outputs, spec, np.random.default_rng(0))
    assert a != add_tool_calls(outputs, spec, np.random.default_rng(1))
    assert a[0] == () and len(a[1]) == 1 and all(len(c) == 3 for c in a[2:])
    for n, calls in zip(outputs, a):
        check_tool_calls(calls, n, "transform")
    assert add_tool_calls(outputs, {**spec, "fraction": 0.0}, np.random.default_rng(0)) == [()] * 5
    fixed = add_tool_calls(outputs, {**spec, "fixed_duration": True}, np.random.default_rng(0))
    assert {c.duration_s for calls in fixed for c in calls} == {2.0}
    with pytest.raises(TraceError, match=r"trace.tool_calls.calls"):
        add_tool_calls(outputs, {"calls": 0}, np.random.default_rng(0))
    with pytest.raises(TraceError, match=r"trace.tool_calls.wait"):
        add_tool_calls(outputs, {"wait": 1}, np.random.default_rng(0))


def test_a_running_request_short_of_kv_held_by_a_paused_one_waits_for_the_tool_not_a_violation():
    """A paused request keeps half the cache; a long prompt runs out of blocks mid-prefill and
    the policy's plan is empty: the engine waits for the tool, then frees the kept KV (that
    request waits behind the prefill), and both finish."""
    trace = (TraceRequest(0.0, 40, 10, tool_calls=(ToolCall(2, 0.5, 8),)), TraceRequest(0.01, 80, 5))
    cfg = EngineConfig(block_size=8, num_blocks=12, max_num_batched_tokens=16, max_num_seqs=4, max_model_len=256,
                       tool_kv="keep")
    result = run_checked(lambda: Chunked(chunk_size=16), Scenario(trace, cfg))
    assert result.status == "complete", result.error
    assert result.sections.get("tool_calls").stats["kept"] == 1 and result.sections.get("tool_calls").stats["kept_released"] == 1
    a, b = result.requests
    assert b.token_times[0] > a.token_times[1] + 0.5                   # it waited for the tool's return
