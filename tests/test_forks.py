"""Parallel samples as copy-on-write forks: the prompt's blocks are shared by reference count and
counted once, a shared block is copied before it is written, each sample runs to its own trace
length, the request is done with its last sample, and on the torch plane the samples draw
differently while sample 0 draws exactly what it draws alone."""
from __future__ import annotations

import dataclasses
import json

import pytest

from policies.chunked import Chunked
from policylab.core.config import EngineConfig, check_engine_config
from policylab.core.contract import StepPlan
from policylab.core.engine import Engine
from policylab.core.features import CombinationError, check_combination, features_of
from policylab.core.request import SamplingParams, Status, TraceRequest
from policylab.testing.harness import Scenario, _dataplane, run_checked
from policylab.testing.suite import (pytest_generate_tests, test_invariants_with_beams,  # noqa: F401
                                     test_invariants_with_forks)
from policylab.traces.errors import TraceError
from policylab.traces.native import record_of, request_from_record

pytestmark = pytest.mark.timeout(300)

CFG = EngineConfig(block_size=8, num_blocks=200, max_num_batched_tokens=256, max_num_seqs=16, max_model_len=512)


def sim_engine(trace, cfg=CFG, policy=None) -> Engine:
    return Engine(trace, policy or Chunked(chunk_size=64), _dataplane(0), dataclasses.replace(cfg, check_invariants=True))


def test_forks_share_the_prompt_once_and_copy_the_block_they_write():
    """One 40-token prompt (5 full blocks of 8), 4 samples: after the fork the prompt's 5 blocks are
    held 4 times and counted once; the next step copies the block each fork writes its last prompt
    token into (3 copies: the last holder writes in place) and sample 0 takes a new block."""
    engine = sim_engine([TraceRequest(0.0, 40, 6, n=4)])
    engine.begin()
    engine.step()                                  # the prefill: sample 0's first token, then the forks
    parent = engine.requests[0]
    assert len(parent.forks) == 3 and all(f.status is Status.RUNNING for f in parent.forks)
    assert engine.kv.num_used == 5 and [engine.kv.refs[b] for b in parent.block_table] == [4] * 5
    assert all(f.num_computed_tokens == 39 and f.block_table == parent.block_table for f in parent.forks)
    engine.step()
    assert engine.extension("forks").stats["cow_copies"] == 3
    assert engine.kv.num_used == 5 + 3 + 1
    tails = [r.block_table[4] for r in (parent, *parent.forks)]
    assert len(set(tails)) == 4 and all(engine.kv.refs[b] == 1 for b in tails)
    assert all(engine.kv.refs[b] == 4 for b in parent.block_table[:4])


def test_each_sample_runs_to_its_trace_length_and_the_request_ends_with_the_last():
    trace = [TraceRequest(0.0, 30, 5, n=3, fork_output_tokens=(9, 2)), TraceRequest(0.001, 20, 4)]
    result = run_checked(lambda: Chunked(chunk_size=64), Scenario(tuple(trace), CFG))
    parent = result.requests[0]
    assert [len(r.output_ids) for r in (parent, *parent.forks)] == [5, 9, 2]
    assert parent.finish_time == max(f.finish_time for f in parent.forks) > parent.token_times[-1]
    assert parent.token_times[0] < min(f.token_times[0] for f in parent.forks)   # TTFT: its first token
    assert result.requests[1].forks is None and result.sections["forks"]["fork_sequences"] == 2


def test_metrics_time_a_request_by_its_own_stream_and_count_every_sample():
    from policylab.analysis.metrics import request_table, step_table, summarize
    from policylab.core.config import FairnessConfig, SloConfig
    trace = [TraceRequest(0.0, 30, 5, n=3, fork_output_tokens=(40, 2))]
    result = run_checked(lambda: Chunked(chunk_size=64), Scenario(tuple(trace), CFG))
    table = request_table(result, SloConfig())
    r = result.requests[0]
    assert table["e2e"][0] == pytest.approx(r.finish_time - r.arrival_time)   # the last sample's end
    assert table["tpot"][0] == pytest.approx((r.token_times[-1] - r.token_times[0]) / 4)   # its own stream
    summary = summarize(table, step_table(result), result, SloConfig(), FairnessConfig())
    assert summary["forks"]["fork_output_tokens"] == 42 and summary["forks"]["finished_forks"] == 2


def test_sharing_holds_fewer_blocks_than_independent_requests():
    """The same prompts as 4 samples each, or as 4 independent requests: sharing peaks lower."""
    base = [TraceRequest(0.0, 64, 24), TraceRequest(0.0, 48, 24)]
    forked = run_checked(lambda: Chunked(chunk_size=256), Scenario(tuple(dataclasses.replace(t, n=4) for t in base), CFG))
    alone = run_checked(lambda: Chunked(chunk_size=256), Scenario(tuple(t for t in base for _ in range(4)), CFG))
    assert sum(len(r.output_ids) for r in forked.requests) == sum(len(r.output_ids) for r in alone.requests)
    assert max(forked.steps["kv_used_blocks"]) < max(alone.steps["kv_used_blocks"])


def test_the_override_forks_every_request_and_one_sample_changes_nothing():
    trace = [TraceRequest(0.001 * i, 20 + 3 * i, 6 + i) for i in range(6)]
    base = sim_engine(trace).run()
    one = sim_engine(trace, dataclasses.replace(CFG, parallel_samples=1)).run()
    assert [r.output_ids for r in one.requests] == [r.output_ids for r in base.requests]
    assert [r.token_times for r in one.requests] == [r.token_times for r in base.requests] and "forks" not in one.sections
    three = sim_engine(trace, dataclasses.replace(CFG, parallel_samples=3)).run()
    assert three.sections["forks"]["fork_sequences"] == 12
    assert all(len(f.output_ids) == t.output_tokens for r, t in zip(three.requests, trace) for f in r.forks)
    with pytest.raises(ValueError, match="engine.parallel_samples"):
        check_engine_config(dataclasses.replace(CFG, parallel_samples=-1))


def test_forks_that_find_no_free_slot_wait_in_front_of_the_queue():
    cfg = dataclasses.replace(CFG, max_num_seqs=3)
    result = run_checked(lambda: Chunked(chunk_size=64), Scenario((TraceRequest(0.0, 30, 8, n=5),), cfg))
    assert result.sections["forks"]["queued_forks"] == 2
    assert all(len(f.output_ids) == 8 for f in result.requests[0].forks)


def test_native_trace_fields_and_their_errors():
    rec = {"arrival_time": 0.5, "prompt_tokens": 9, "output_tokens": 3, "n": 3, "fork_output_tokens": [4, 7]}
    raw = request_from_record(rec, "t.jsonl", 4)
    assert (raw.n, raw.fork_output_tokens) == (3, (4, 7))
    assert record_of(raw) == rec
    for bad, says in (({"n": 0}, "field 'n': expected a positive integer"),
                      ({"n": 3, "fork_output_tokens": [4]}, "expected 2 output lengths"),
                      ({"n": 2, "fork_output_tokens": [0]}, "'fork_output_tokens': expected a positive integer"),
                      ({"n": 2, "fork_output_tokens": 5}, "expected a list of output lengths")):
        with pytest.raises(TraceError, match=says) as e:
            request_from_record({"arrival_time": 0, "prompt_tokens": 9, "output_tokens": 3, **bad}, "t.jsonl", 4)
        assert "t.jsonl:4" in str(e.value)


def test_vllm_refuses_forks_in_one_line():
    trace = [TraceRequest(0.0, 9, 3), TraceRequest(0.0, 9, 3, n=2)]
    for samples in (0, 1):
        assert "forks" not in features_of(trace[:1], dataclasses.replace(CFG, parallel_samples=samples))
    for t, samples in ((trace, 0), (trace[:1], 2)):
        features = features_of(t, dataclasses.replace(CFG, parallel_samples=samples))
        with pytest.raises(CombinationError) as e:
            check_combination(features, frozenset(), "vllm")
        assert str(e.value).startswith("forks and dataplane=vllm do not compose") and "\n" not in str(e.value)


def test_torch_plane_samples_differ_and_sample_zero_draws_as_it_does_alone():
    """Seeded sampling: the forks draw other tokens than sample 0 (their own req_ids seed their
    draws), and sample 0 draws exactly its tokens of a run without forks: no fork wrote into a
    block it still read. Greedy, every sample equals the request alone: the shared prompt's KV
    and each fork's copy of its last block are exact. The shared prompt is held once."""
    pytest.importorskip("torch")
    from policylab.dataplane.torch_plane import TorchDataPlane
    from tests.test_dataplane_model import SMALL, dataplane

    cfg = EngineConfig(block_size=4, num_blocks=64, max_num_batched_tokens=64, max_num_seqs=8,
                       max_model_len=256, check_invariants=True)

    def replay(n: int, temperature: float):
        plane = TorchDataPlane.from_config(dataplane(), SMALL, seed=0)
        trace = [TraceRequest(0.0, 14, 10, n=n)]
        engine = Engine(trace, Chunked(chunk_size=64), plane, cfg, seed=0,
                        sampling=SamplingParams(temperature=temperature, seed=3))
        result = engine.run()
        assert result.status == "complete", result.error
        return result

    alone, forked = replay(1, 0.9), replay(3, 0.9)
    samples = [forked.requests[0].output_ids] + [f.output_ids for f in forked.requests[0].forks]
    assert samples[0] == alone.requests[0].output_ids
    assert len({tuple(s) for s in samples}) == 3
    assert forked.sections["forks"]["cow_copies"] == 2        # 14 tokens: the block of the last prompt token, twice
    assert max(forked.steps["kv_used_blocks"]) < 3 * max(alone.steps["kv_used_blocks"])
    greedy_alone, greedy = replay(1, 0.0), replay(3, 0.0)
    assert all(f.output_ids == greedy_alone.requests[0].output_ids
               for f in (greedy.requests[0], *greedy.requests[0].forks))


def test_the_harness_catches_a_write_into_a_shared_block(monkeypatch):
    """Without the copy, a fork writes into the block it shares: the harness names the invariant."""
    from policylab.core.kv import KVManager
    from policylab.testing.properties import InvariantViolation
    monkeypatch.setattr(KVManager, "copy_on_write", lambda self, writes: None)
    with pytest.raises(InvariantViolation, match="no_write_while_shared"):
        run_checked(lambda: Chunked(chunk_size=64), Scenario((TraceRequest(0.0, 30, 6, n=2),), CFG))


def test_beams_fork_sharing_every_block_and_the_worst_become_copies_of_the_best():
    engine = sim_engine([TraceRequest(0.0, 30, 12, beam_width=3)])
    engine.begin()
    engine.step()
    parent = engine.requests[0]
    beams = (parent, *parent.forks)
    assert all(b.output_ids == parent.output_ids and b.block_table == parent.block_table for b in beams)
    assert all(engine.kv.refs[b] == 3 for b in parent.block_table) and engine.kv.num_used == 4
    engine.step()              # every beam writes its second token (2 copies), then a round:
    assert engine.extension("forks").stats["cow_copies"] == 2     # the worst beam becomes a copy of the best
    assert engine.extension("forks").stats["beam_replacements"] == 1
    score = engine.extension("forks").beams.score
    best = max(beams, key=lambda b: (score[b.req_id], -b.req_id))
    twins = [b for b in beams if b is not best and b.block_table == best.block_table]
    assert len(twins) == 1 and twins[0].output_ids == best.output_ids
    result = run_checked(lambda: Chunked(chunk_size=64), Scenario((TraceRequest(0.0, 30, 12, beam_width=3),), CFG))
    assert all(len(b.output_ids) == 12 for b in (result.requests[0], *result.requests[0].forks))
    assert result.sections["forks"]["beam_replacements"] > 5
    one = run_checked(lambda: Chunked(chunk_size=64), Scenario((TraceRequest(0.0, 10, 1, beam_width=3),), CFG))
    assert one.requests[0].forks is None and one.requests[0].status is Status.FINISHED   # one token: one beam


class _RecomputesTheLeadingBeam(Chunked):
    """Beams a, b, c of request 0 (a filler, request 1, waits): all decode (a round at 2 tokens);
    a and b decode a third token while c idles; the better-scoring of a and b is preempted and
    recomputed, and comes back with a 16-token chunk (of its 33 tokens: not decoding) in the step
    where c decodes its third token. Then every request runs to its end."""

    def __init__(self, scores):
        super().__init__(chunk_size=64)
        self.scores, self.victim = scores, None

    def schedule(self, view):
        step, beams = view.step, sorted(rid for rid in view.by_id if rid != 1)
        if step in (1, 2, 3, 4):
            a, b, c = beams
        if step == 0:
            return StepPlan({0: 30})
        if step == 1:
            return StepPlan({a: 1, b: 1, c: 1})
        if step == 2:
            return StepPlan({a: 1, b: 1})
        if step == 3:
            self.victim = max((a, b), key=lambda rid: (self.scores()[rid], -rid))
            return StepPlan({1: 4}, preempt=[self.victim])
        if step == 4:
            return StepPlan({c: 1, self.victim: 16})
        return super().schedule(view)


@pytest.mark.timeout(30)
def test_beams_compare_only_when_every_beam_decodes():
    """In step 4 the beams are in step (3 tokens each, all running) but one is recomputing its KV:
    16 of its 32 computed tokens are back. No round then (a copy of it would take a table that does
    not hold the tokens it claims, and one made of it would lose its KV); the next round comes once
    it decodes again, and every beam's table always covers its computed tokens."""
    from policylab.core.request import is_decoding
    cfg = dataclasses.replace(CFG, enable_prefix_caching=False, check_invariants=True)
    holder = {}
    policy = _RecomputesTheLeadingBeam(lambda: holder["engine"].extension("forks").beams.score)
    engine = holder["engine"] = Engine([TraceRequest(0.0, 30, 12, beam_width=3), TraceRequest(0.0, 20, 2)],
                                       policy, _dataplane(0), cfg)
    stats, bs = engine.extension("forks").stats, cfg.block_size
    for _ in range(4):
        engine.step()
    before = stats["beam_replacements"]
    assert before == 1                                 # the round at 2 tokens
    engine.step()                                      # c's third token; the victim recomputes
    parent = engine.requests[0]
    beams = (parent, *parent.forks)
    victim = engine.requests[policy.victim]
    assert all(len(b.output_ids) == 3 and b.status is Status.RUNNING for b in beams)
    assert victim.num_computed_tokens == 16 and not is_decoding(victim)
    assert stats["beam_replacements"] == before        # no round with a beam recomputing
    assert all(len(b.block_table) * bs >= b.num_computed_tokens for b in beams)
    result = engine.run()
    assert result.status == "complete" and stats["beam_replacements"] > before
    assert all(len(b.output_ids) == 12 for b in beams)


def test_beam_trace_field_and_override():
    raw = request_from_record({"arrival_time": 0, "prompt_tokens": 9, "output_tokens": 3, "beam_width": 4}, "t.jsonl", 2)
    assert raw.beam_width == 4
    with pytest.raises(TraceError, match="t.jsonl:2: field 'beam_width': a request has parallel samples"):
        request_from_record({"arrival_time": 0, "prompt_tokens": 9, "output_tokens": 3, "n": 2, "beam_width": 2},
                            "t.jsonl", 2)
    result = sim_engine([TraceRequest(0.0, 20, 8)], dataclasses.replace(CFG, beam_width=4)).run()
    assert result.sections["forks"]["beam_requests"] == 1 and len(result.requests[0].forks) == 3
    with pytest.raises(CombinationError, match="^beams and dataplane=vllm do not compose"):
        check_combination(features_of([TraceRequest(0.0, 9, 3)], dataclasses.replace(CFG, beam_width=2)),
                          frozenset(), "vllm")
    with pytest.raises(ValueError, match="engine.beam_width"):
        check_engine_config(dataclasses.replace(CFG, beam_width=-2))


def test_torch_plane_beams_score_real_log_probabilities_and_copy_kv():
    """Beams score the model's log-probabilities of their tokens and are replaced on the fly; with
    greedy sampling every beam equals the request alone (replacements and copies keep the KV exact)."""
    pytest.importorskip("torch")
    from policylab.dataplane.torch_plane import TorchDataPlane
    from tests.test_dataplane_model import SMALL, dataplane

    cfg = EngineConfig(block_size=4, num_blocks=64, max_num_batched_tokens=64, max_num_seqs=8,
                       max_model_len=256, check_invariants=True)

    def replay(width: int, temperature: float):
        plane = TorchDataPlane.from_config(dataplane(), SMALL, seed=0)
        copies = []
        copy = plane.copy_kv_blocks
        plane.copy_kv_blocks = lambda src, dst: copies.append(len(src)) or copy(src, dst)
        engine = Engine([TraceRequest(0.0, 13, 9, beam_width=width)], Chunked(chunk_size=64), plane, cfg, seed=0,
                        sampling=SamplingParams(temperature=temperature, seed=1))
        result = engine.run()
        assert result.status == "complete", result.error
        return result, engine, copies

    sampled, engine, copies = replay(3, 1.0)
    assert sampled.sections["forks"]["beam_replacements"] > 0 and sum(copies) == sampled.sections["forks"]["cow_copies"] > 0
    scores = engine.extension("forks").beams.score.values()
    assert all(-100 < s < 0 for s in scores)        # sums of 8 log-probabilities of a 1000-token vocabulary
    alone = replay(1, 0.0)[0].requests[0].output_ids
    greedy = replay(3, 0.0)[0].requests[0]
    assert all(b.output_ids == alone for b in (greedy, *greedy.forks))


@pytest.mark.parametrize("policy", ["chunked", "prefill_first", "vllm_v1"])
def test_invariants_hold_on_generated_fork_scenarios(policy):
    from hypothesis import HealthCheck, given, settings
    from policylab.testing.suite import checked
    from policylab.testing.loader import shipped_policy_configs
    from policylab.testing.strategies import fork_scenarios
    spec = next(s for s in shipped_policy_configs() if s.endswith(f"/{policy}.yaml"))

    @settings(deadline=None, max_examples=15, suppress_health_check=[HealthCheck.too_slow])
    @given(scenario=fork_scenarios(max_requests=12))
    def check(scenario):
        checked(spec, scenario, determinism=False)
    check()


def _trace_file(path):
    import json
    rows = [{"arrival_time": 0.01 * i, "prompt_tokens": 40 + 9 * i, "output_tokens": 6 + i, "n": 3,
             "fork_output_tokens": [4, 9 + i]} for i in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_cli_run_serves_the_trace_fields_and_writes_the_forks_section(tmp_path, monkeypatch):
    """(Rows written while the run goes, two at a time, time each request by its own stream too.)"""
    import json
    import pandas as pd
    from policylab.analysis import result_stream
    from policylab.apps.cli import main
    monkeypatch.setattr(result_stream, "ROWS_PER_GROUP", 2)
    trace = _trace_file(tmp_path / "forks.jsonl")
    main(["run", "trace=file", f"trace.path={trace}", "dataplane=sim", "logger=none", "plots=false",
          "progress=false", f"hydra.run.dir={tmp_path / 'run'}"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    forks = summary["forks"]
    assert forks["forked_requests"] == 8 and forks["fork_sequences"] == 16 and forks["finished_forks"] == 16
    assert forks["fork_output_tokens"] == sum(4 + 9 + i for i in range(8))
    assert summary["counts"]["finished"] == 8
    rows = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    own_end = rows["first_token_time"] + rows["tpot"] * (rows["generated_tokens"] - 1)
    assert (own_end < rows["finish_time"] - 1e-9).all()    # the longest sample (9 + i tokens) ends later


def test_cli_replicas_serve_forks_and_pd_refuses_them_in_one_line(tmp_path, capsys):
    """Colocated replicas fork requests as one engine does (each sample on its request's replica),
    and the summary counts every replica's forks; under P/D the prefill replicas stop at the first
    token, so forks are refused before the run."""
    from policylab.apps.cli import main
    trace = _trace_file(tmp_path / "forks.jsonl")
    common = ["run", "trace=file", f"trace.path={trace}", "dataplane=sim", "logger=none", "plots=false", "progress=false"]
    main([*common, "cluster.replicas=2", f"hydra.run.dir={tmp_path / 'run'}"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["counts"]["finished"] == 8
    assert summary["forks"]["forked_requests"] == 8 and summary["forks"]["finished_forks"] == 16
    with pytest.raises(SystemExit):
        main([*common, "cluster.prefill_replicas=1", "cluster.decode_replicas=1", f"hydra.run.dir={tmp_path / 'pd'}"])
    err = capsys.readouterr().err
    assert "forks and P/D disaggregation" in err and "do not compose" in err and "Traceback" not in err


@pytest.mark.slow
def test_cli_vllm_refuses_forks_before_loading_vllm(tmp_path):
    from vllm_cli import run_on_vllm
    proc = run_on_vllm("run", ["trace=bursty", "trace.max_requests=2", "engine.parallel_samples=2"],
                       tmp_path, tmp_path / "run", timeout=240)
    assert proc.returncode != 0
    assert "forks and dataplane=vllm do not compose" in proc.stderr
    assert not (tmp_path / "run" / "summary.json").exists()


def test_torch_plane_copies_kv_blocks_pairwise_and_nothing_else():
    torch = pytest.importorskip("torch")
    from tests.test_dataplane_model import SMALL, make_plane
    plane = make_plane(SMALL, num_blocks=8)
    plane.kv.copy_(torch.randn_like(plane.kv))
    before = plane.export_kv(list(range(8))).clone()
    plane.copy_kv_blocks([1, 2], [5, 6])
    after = plane.export_kv(list(range(8)))
    dim = plane._block_dim()
    assert torch.equal(after.select(dim, 5), before.select(dim, 1))
    assert torch.equal(after.select(dim, 6), before.select(dim, 2))
    for b in (0, 1, 2, 3, 4, 7):
        assert torch.equal(after.select(dim, b), before.select(dim, b))
