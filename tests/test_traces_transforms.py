"""TraceConfig transforms: rate scale, first N, window, clipping (counted), sampling, clients, SLO classes."""
import pytest

from policylab.core.request import TraceRequest
from policylab.traces import TraceConfig, TraceError, load_trace, write_native


@pytest.fixture
def trace_file(tmp_path):
    """20 requests 1 s apart starting at t=100 s, prompts 10..200, outputs 5..100, two clients."""
    reqs = [TraceRequest(100.0 + i, 10 * (i + 1), 5 * (i + 1), f"c{i % 2}", prefix_hashes=(i, i + 1, i + 2))
            for i in range(20)]
    path = tmp_path / "t.jsonl"
    write_native(path, reversed(reqs))   # out of order on disk: loading sorts
    return str(path)


def _load(path, seed=0, **kw):
    return load_trace(TraceConfig(path=path, **kw), seed)


def test_rate_scale_compresses_inter_arrivals(trace_file):
    assert [r.arrival_time for r in _load(trace_file, rate_scale=2.0)][:3] == [0.0, 0.5, 1.0]
    assert _load(trace_file, rate_scale=0.5)[-1].arrival_time == 38.0


def test_max_requests_keeps_the_first_n(trace_file):
    trace = _load(trace_file, max_requests=5)
    assert [r.prompt_tokens for r in trace] == [10, 20, 30, 40, 50]
    assert trace.report.over_max_requests == 15


def test_window_keeps_its_span_and_is_relative_to_its_start(trace_file):
    trace = _load(trace_file, start_time=4.5, end_time=8.0)
    assert [(r.arrival_time, r.prompt_tokens) for r in trace] == [(0.5, 60), (1.5, 70), (2.5, 80)]
    assert trace.report.out_of_window == 17
    assert _load(trace_file, end_time=3.0)[-1].arrival_time == 2.0


def test_clipping_is_counted_and_trims_prefix_blocks(trace_file):
    trace = _load(trace_file, max_prompt_tokens=150, max_output_tokens=50, prefix_block_tokens=64)
    assert max(r.prompt_tokens for r in trace) == 150 and max(r.output_tokens for r in trace) == 50
    assert (trace.report.clipped_prompts, trace.report.clipped_outputs) == (5, 10)
    assert all(len(r.prefix_hashes) == 3 for r in trace if r.prompt_tokens < 150)
    assert all(len(r.prefix_hashes) == 3 for r in trace if r.prompt_tokens == 150)   # ceil(150/64) = 3
    assert len(_load(trace_file, max_prompt_tokens=100, prefix_block_tokens=64)[-1].prefix_hashes) == 2
    assert "prompts clipped: 5; outputs clipped: 10" in trace.report.summary()


def test_sampling_is_seeded_and_rebased(trace_file):
    a, b = _load(trace_file, seed=1, sample_fraction=0.5), _load(trace_file, seed=1, sample_fraction=0.5)
    assert a == b and 2 <= len(a) <= 18 and a[0].arrival_time == 0.0
    assert a.report.sampled_out == 20 - len(a)
    others = [_load(trace_file, seed=s, sample_fraction=0.5) for s in range(2, 6)]
    assert any(o != a for o in others)


def test_client_assignment_round_robin_and_zipf(trace_file):
    rr = _load(trace_file, client_assignment="round_robin", num_clients=3)
    assert [r.client for r in rr[:4]] == ["client-0", "client-1", "client-2", "client-0"]
    assert [r.client for r in _load(trace_file)[:2]] == ["c0", "c1"]    # keep: the trace's own
    z = _load(trace_file, client_assignment="zipf", num_clients=3, zipf_exponent=3.0)
    counts = [sum(r.client == f"client-{k}" for r in z) for k in range(3)]
    assert counts[0] > counts[1] >= counts[2] and sum(counts) == 20


def test_slo_classes_by_client_and_by_ratio(trace_file):
    by_client = _load(trace_file, slo_by_client={"c0": "interactive"})
    assert {(r.client, r.ttft_slo, r.tpot_slo) for r in by_client} == {("c0", 0.5, 0.05), ("c1", None, None)}
    ratio = _load(trace_file, slo_classes={"gold": {"ttft_slo": 1, "tpot_slo": 0.1},
                                           "bronze": {"ttft_slo": 9, "tpot_slo": None}},
                  slo_ratio={"gold": 0, "bronze": 1})
    assert {(r.ttft_slo, r.tpot_slo) for r in ratio} == {(9.0, None)}


@pytest.mark.parametrize("kw,field", [
    ({"rate_scale": 0}, "trace.rate_scale"), ({"max_requests": 0}, "trace.max_requests"),
    ({"start_time": 5, "end_time": 5}, "trace.end_time"), ({"max_prompt_tokens": 0}, "trace.max_prompt_tokens"),
    ({"sample_fraction": 1.5}, "trace.sample_fraction"), ({"client_assignment": "hash"}, "trace.client_assignment"),
    ({"client_assignment": "column"}, "trace.client_column"), ({"slo_ratio": {"gold": 1}}, "trace.slo_ratio"),
    ({"slo_by_client": {"c0": "x"}}, "trace.slo_by_client"), ({"num_clients": 0}, "trace.num_clients"),
])
def test_bad_transform_settings_name_the_key(trace_file, kw, field):
    with pytest.raises(TraceError) as err:
        _load(trace_file, **kw)
    assert err.value.field == field and field in str(err.value)


def test_window_that_keeps_nothing_is_an_error(trace_file):
    with pytest.raises(TraceError, match="no requests left.*outside the time window: 20"):
        _load(trace_file, start_time=500.0)
