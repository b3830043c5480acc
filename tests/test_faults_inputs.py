"""Fault injection, part 2: wrong numbers, contract bypasses and bad input .

All in-process and on the sim data plane; each bad input must end in one line naming the file
or the field, and a run that starts must keep every request.
"""
from __future__ import annotations

import gzip
import json
import math

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from policylab.apps.cli import CONFIG_DIR, main
from policylab.apps.config import ConfigError, typed_config
from policylab.apps.jobs import check_output_dir_writable
from policylab.apps.run import run
from policylab.core.config import EngineConfig, HardwareConfig, ModelConfig
from policylab.dataplane.config import DataplaneConfig
from policylab.core.contract import ContractViolation, StepPlan
from policylab.core.engine import Engine
from policylab.core.request import TraceRequest
from policylab.dataplane.fitted import FEATURES, load_calibration
from policylab.dataplane.sim import SimDataPlane
from policylab.traces import TraceConfig, TraceError, load_trace
from policies.prefill_first import PrefillFirst

SIM = DataplaneConfig(kind="sim")
TRACE = [TraceRequest(0.1 * i, 40 + i, 8) for i in range(20)]


def sim(**hardware):
    return SimDataPlane(ModelConfig(name="llama3-8b"), HardwareConfig(**hardware), SIM)


def engine(policy=None, trace=TRACE, plane=None, **cfg):
    return Engine(trace, policy or PrefillFirst(), plane or sim(),
                  EngineConfig(num_blocks=64, max_num_batched_tokens=128, max_num_seqs=8, **cfg))


def config(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=["trace=poisson", "dataplane=sim", "logger=none", "progress=false",
                                            "plots=false", *overrides])


# ------------------------------------------------------ 7. NaN / negative costs
class CostsGoBad(SimDataPlane):
    """The roofline until step 10, then a fixed bad duration."""

    def __init__(self, bad: float):
        super().__init__(ModelConfig(name="llama3-8b"), HardwareConfig(), SIM)
        self.bad, self.steps = bad, 0

    def _step_time(self, batch, tokens, sampled, context=None):
        self.steps += 1
        return self.bad if self.steps > 10 else super()._step_time(batch, tokens, sampled, context)


@pytest.mark.parametrize("bad", [math.nan, -0.5, math.inf])
def test_a_bad_step_duration_ends_the_run_naming_the_data_plane_and_batch(bad):
    result = engine(plane=CostsGoBad(bad)).run()
    assert result.status == "partial" and len(result.requests) == len(TRACE)
    assert f"data plane CostsGoBad returned a step duration of {bad!r} s for a batch of" in result.error
    assert "durations must be finite and >= 0" in result.error


@pytest.mark.parametrize("field, value", [("step_overhead", math.nan), ("step_overhead", -1.0),
                                          ("kernel_latency", -1e-6), ("kernel_latency", math.inf),
                                          ("mem_bandwidth", 0.0), ("peak_flops", math.inf),
                                          ("elementwise_bw_efficiency", 0.0), ("elementwise_latency", -1e-6)])
def test_the_roofline_refuses_parameters_that_break_the_clock(field, value):
    with pytest.raises(ValueError, match=f"hardware.{field} must be a finite number"):
        sim(**{field: value})


@pytest.mark.parametrize("content, expected", [
    ("{not json", "not a calibration JSON file"),
    ("[1, 2]", "expected a JSON object with 'features' and 'weights'.*got list"),
    ("{}", "expected a JSON object with 'features' and 'weights'"),
    (json.dumps({"features": list(FEATURES), "weights": [float("nan")] + [0] * (len(FEATURES) - 1)}), "'weights' must be finite and >= 0"),
    (json.dumps({"features": list(FEATURES), "weights": [-1e-3] + [0] * (len(FEATURES) - 1)}), "'weights' must be finite and >= 0"),
    (json.dumps({"features": list(FEATURES), "weights": [1, 2]}), f"'weights' must be a list of {len(FEATURES)} numbers"),
])
def test_a_bad_calibration_file_is_one_line_naming_it(tmp_path, content, expected):
    path = tmp_path / "calibration.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=f"calibration.json: {expected}") as error:
        load_calibration(path)
    assert "\n" not in str(error.value)


# ------------------------------------------------------------- 8. arrival bound
def test_arrivals_beyond_the_bound_are_refused(tmp_path):
    path = tmp_path / "far.jsonl"
    path.write_text('{"arrival_time": 0, "prompt_tokens": 5, "output_tokens": 5}\n'
                    '{"arrival_time": 1e12, "prompt_tokens": 5, "output_tokens": 5}\n')
    with pytest.raises(TraceError, match=r"far.jsonl: field 'arrival_time': a request arrives 1e\+12 s"):
        load_trace(TraceConfig(path=str(path)))
    path.write_text('{"arrival_time": 0, "prompt_tokens": 5, "output_tokens": 5}\n'
                    '{"arrival_time": 1e17, "prompt_tokens": 5, "output_tokens": 5}\n')
    with pytest.raises(TraceError, match=r"far.jsonl:2: field 'arrival_time': expected a finite number of seconds "
                                         r">= 0 \(at most 1e\+15\), got 1e\+17"):      # (its line, when it can)
        load_trace(TraceConfig(path=str(path)))
    with pytest.raises(ValueError, match=r"arrival_time 1e\+17 s is outside \[0, 1e\+09\] s"):
        engine(trace=[TraceRequest(0.0, 5, 5), TraceRequest(1e17, 5, 5)])


# ------------------------------------------------- 9. oversized requests
def test_an_oversized_request_is_rejected_by_arithmetic_before_any_token_is_built():
    trace = TRACE + [TraceRequest(0.05, 3 * 10**9, 5)]
    result = engine(trace=trace).run()
    huge = next(r for r in result.requests if r.prompt_len == 0)
    assert result.status == "complete" and huge.status.value == "rejected"
    assert "prompt (3000000000) + output (5) tokens exceed max_model_len" in huge.reject_reason
    assert not huge.block_hashes                        # no 3e9-token prompt, no hashes for it


# ------------------------------------------------------- 10. read-only view
class Snoop(PrefillFirst):
    """prefill_first that keeps the last view it saw."""

    def schedule(self, view):
        self.view = view
        return super().schedule(view)


def test_the_view_and_request_views_refuse_writes_and_lead_nowhere():
    policy = Snoop()
    engine(policy).run()
    view = policy.view
    for name in ("max_num_batched_tokens", "max_num_seqs", "num_free_blocks", "by_id", "decoding"):
        with pytest.raises(AttributeError):
            setattr(view, name, 10**9)
    e = engine(Snoop())
    e.step()
    v = next(iter(e.policy.view.by_id.values()))     # (waiting and by_id are live windows: a live request)
    for name in ("req_id", "prompt_len", "num_computed_tokens", "_r", "_kv", "_hit"):
        with pytest.raises(AttributeError):
            setattr(v, name, 1)
    for name in ("_r", "_kv", "_hit", "__dict__"):
        assert not hasattr(v, name)
    before = v.prompt_len
    try:
        type(v).__init__(v, object(), None)          # re-initializing a live view cannot rebind it
    except TypeError:
        pass
    assert v.prompt_len == before
    assert getattr(e.policy.view.blocks_needed, "__self__", None) is e.policy.view   # a method of the view


class RaisesItsOwnLimits(PrefillFirst):
    """Tries to raise its budget, then schedules every waiting prompt whole."""

    def schedule(self, view):
        for name in ("max_num_batched_tokens", "max_num_seqs", "num_free_blocks"):
            try:
                setattr(view, name, 10**9)
            except AttributeError:
                pass
        view = view.replace(max_num_batched_tokens=10**9, max_num_seqs=10**9)   # a copy: no effect
        return StepPlan({v.req_id: v.remaining_tokens for v in view.waiting})


def test_a_policy_cannot_raise_its_own_limits():
    trace = [TraceRequest(0.0, 100, 4) for _ in range(6)]
    result = engine(RaisesItsOwnLimits(), trace=trace).run()
    assert result.status == "partial" and "broke rule 'token_budget'" in result.error
    with pytest.raises(ContractViolation, match="token_budget"):
        engine(RaisesItsOwnLimits(), trace=trace).step()


class ChangesAfterValidation(dict):
    """A plan mapping that answers with small counts when first read and huge ones later."""

    reads = 0

    def values(self):
        ChangesAfterValidation.reads += 1
        return super().values() if ChangesAfterValidation.reads == 1 else [3100] * len(self)

    def items(self):
        return zip(self.keys(), self.values())


class ShiftyPlan(StepPlan):
    """A StepPlan whose token map is a new, larger one every time it is read after the first."""

    def __init__(self, tokens):
        super().__init__()
        self._tokens, self._reads = tokens, 0

    @property
    def num_scheduled_tokens(self):
        self._reads += 1
        return self._tokens if self._reads == 1 else {rid: 3100 for rid in self._tokens}

    @num_scheduled_tokens.setter
    def num_scheduled_tokens(self, value):
        pass


@pytest.mark.parametrize("make", [lambda t: StepPlan(ChangesAfterValidation(t)), ShiftyPlan],
                         ids=["dict_subclass", "stepplan_subclass"])
def test_a_plan_that_changes_after_validation_runs_as_validated(make):
    """The engine reads a plan once into a private copy, validates it and executes that copy: a plan
    object that answers differently on later reads cannot get a step past the token budget."""
    class Shifty(PrefillFirst):
        def schedule(self, view):
            plan = super().schedule(view)
            return make(dict(plan.num_scheduled_tokens)) if not plan.preempt else plan

    ChangesAfterValidation.reads = 0
    trace = [TraceRequest(0.0, 60, 4), TraceRequest(0.0, 60, 4)]
    result = engine(Shifty(), trace=trace).run()
    assert result.status == "complete", result.error
    tokens = result.steps["prefill_tokens"] + result.steps["decode_tokens"]
    assert max(tokens) == 120 <= 128         # both prompts whole in one step, within the budget
    assert [len(r.output_ids) for r in result.requests] == [4, 4]


def test_a_plan_its_policy_changes_while_its_rejections_are_committed_runs_as_validated():
    """Rejections call the policy's on_finished during the commit: a policy that then rewrites the
    plan it returned (a preemption of a waiting request, a budget-breaking chunk) changes nothing."""
    class Rewrites(PrefillFirst):
        plan = None

        def schedule(self, view):
            plan = super().schedule(view)
            if 1 in view.by_id and view.by_id[1].status == "waiting":
                plan = StepPlan({}, reject={1: "not this one"})
            self.plan = plan
            return plan

        def on_finished(self, v):
            if self.plan is not None:
                self.plan.num_scheduled_tokens[0] = 10_000
                self.plan.preempt.append(0)

    trace = [TraceRequest(0.0, 60, 4), TraceRequest(0.0, 60, 4)]
    result = engine(Rewrites(), trace=trace).run()
    assert result.status == "complete", result.error
    assert [r.status.value for r in result.requests] == ["finished", "rejected"]
    assert result.requests[0].num_preemptions == 0 and len(result.requests[0].output_ids) == 4
    assert max(result.steps["prefill_tokens"]) == 60


# ------------------------------------------------------------- 11. bad files
@pytest.mark.parametrize("name, content, expected", [
    ("binary.jsonl", b"\x00\x01\xa3\xff\xfe" * 20, r":1: not UTF-8 text \(byte 0xa3 at column 3\)"),
    ("latin1.jsonl", '{"arrival_time": 0, "prompt_tokens": 5, "output_tokens": 5, "client": "£"}\n'
     .encode("latin-1"), ":1: not UTF-8 text"),
    ("truncated.jsonl.gz", gzip.compress(b'{"arrival_time": 0}\n' * 500)[:40], ": not a valid, complete gzip file"),
    ("fake.jsonl.gz", b"this is not gzip\n", ": not a valid, complete gzip file"),
])
def test_an_unreadable_trace_is_one_line_naming_it(tmp_path, name, content, expected):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(TraceError, match=f"{name}{expected}") as error:
        load_trace(TraceConfig(path=str(tmp_path / name)))
    assert "\n" not in str(error.value)


def test_an_unwritable_output_directory_is_one_line(tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(SystemExit) as stop:
        check_output_dir_writable([f"hydra.run.dir={tmp_path / 'a_file' / 'run'}"])
    assert stop.value.code == 2 and "is not a writable folder" in capsys.readouterr().err


# ------------------------------------------------------ 12. config values
@pytest.mark.parametrize("override, expected", [
    ("+trace.max_request=10", "trace.max_request is not a key of trace (did you mean trace.max_requests?)"),
    ("+engine.bogus=1", "engine.bogus is not a key of engine"),
    ("engine.predictor=bogus", "engine.predictor must be 'none' or 'oracle'"),
    ("engine.predictor_noise=-1", "engine.predictor_noise must be a finite number >= 0"),
    ("engine.max_tokens=-5", "engine.max_tokens must be >= 1 or null"),
    ("slo.ttft=-1", "slo.ttft must be a finite number of seconds > 0"),
    ("slo.tpot=nan", "slo.tpot must be a finite number of seconds > 0"),
    ("hardware.mem_bandwidth=0", "hardware.mem_bandwidth must be a finite number > 0"),
    ("model.vocab_size=16", "model.vocab_size must be > 32"),
])
def test_bad_config_values_are_refused_before_the_run(override, expected):
    with pytest.raises(ConfigError) as error:
        typed_config(config(override))
    assert expected in str(error.value)


def test_a_vocabulary_too_small_for_the_sim_is_refused_at_build():
    with pytest.raises(ValueError, match="model.vocab_size must be > 32"):
        SimDataPlane(ModelConfig(vocab_size=16), HardwareConfig(), SIM)


# ------------------------------------------------------------ 13. skipped rows
def test_rows_the_readers_skip_are_counted_by_reason_in_the_summary(tmp_path):
    trace = tmp_path / "azure.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0,100,10\n"
                     "2023-11-16 18:00:01.0,0,10\n2023-11-16 18:00:02.0,100,-3\n2023-11-16 18:00:03.0,50,5\n")
    summary = run(config("trace=file", f"trace.path={trace}"), tmp_path / "run")
    report = json.loads((tmp_path / "run" / "summary.json").read_text())["trace_report"]
    assert report["skipped"] == {"ContextTokens <= 0": 1, "GeneratedTokens <= 0": 1} and report["kept"] == 2
    assert summary["counts"]["requests"] == 2 == len(pd.read_parquet(tmp_path / "run" / "requests.parquet"))


def test_a_misspelled_parquet_column_is_refused_like_a_jsonl_key(tmp_path):
    pd.DataFrame({"arrival_time": [0.0], "prompt_tokens": [5], "output_tokens": [5], "priorty": [1]}) \
        .to_parquet(tmp_path / "t.parquet")
    with pytest.raises(TraceError, match=r"t.parquet: column 'priorty': unknown column"):
        load_trace(TraceConfig(path=str(tmp_path / "t.parquet")))


def test_a_bad_trace_through_the_cli_has_no_traceback(tmp_path, capsys):
    (tmp_path / "bad.jsonl").write_bytes(b"\xa3\xa3\n")
    with pytest.raises(SystemExit):
        main(["run", "trace=file", f"trace.path={tmp_path / 'bad.jsonl'}", "dataplane=sim", "logger=none",
              f"hydra.run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert "bad.jsonl:1: not UTF-8 text (byte 0xa3 at column 1)" in err and "Traceback" not in err
