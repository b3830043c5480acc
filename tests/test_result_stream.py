"""Results streamed while the run goes equal the results written at its end, and their fairness
and ITL those of the whole request table at once (row groups of one client included); a run
cut short keeps what was done, and the engine forgets the requests it has written (bounded
memory)."""
import hashlib

import pandas as pd
import pyarrow.parquet as pq
import pytest

import policylab.analysis.result_stream as stream_module
from policylab.analysis.result_stream import ResultStream
from policylab.analysis.results import summarize_run, write_results
from policylab.core.config import EngineConfig, ModelConfig
from policylab.core.engine import Engine
from policylab.core.request import TraceRequest
from policylab.dataplane.sim import SimDataPlane
from policylab.testing.loader import load_policy
from policylab.testing.replay import SCENARIO_HARDWARE, scenario_dataplane


def engine(policy="chunked", fail_at_step=None) -> Engine:
    trace = [TraceRequest(0.01 * i, 20 + 37 * i % 300, 1 + 13 * i % 40, client="ab"[i // 16 % 2])   # (row
             for i in range(120)]                           # groups of one client in a run of two)
    p = load_policy(policy)
    if fail_at_step is not None:
        schedule = p.schedule

        def interrupted(view):
            if view.step == fail_at_step:
                raise KeyboardInterrupt
            return schedule(view)
        p.schedule = interrupted
    plane = SimDataPlane(ModelConfig(), SCENARIO_HARDWARE, scenario_dataplane(SCENARIO_HARDWARE))   # 4 ms a step
    return Engine(trace, p, plane, EngineConfig(num_blocks=400, max_num_seqs=16))


def files(run_dir) -> tuple:
    def digest(name):
        return hashlib.sha256(pd.read_parquet(run_dir / name).to_csv(float_format=repr).encode()).hexdigest()
    return digest("requests.parquet"), digest("steps.parquet"), (run_dir / "summary.json").read_text()


@pytest.mark.parametrize("fail_at_step", [None, 150])
def test_streamed_results_equal_results_written_at_the_end(tmp_path, monkeypatch, fail_at_step):
    monkeypatch.setattr(stream_module, "ROWS_PER_GROUP", 16)
    monkeypatch.setattr(stream_module, "STEPS_PER_GROUP", 32)
    at_end = engine(fail_at_step=fail_at_step)
    at_end_result = at_end.run()
    write_results(tmp_path / "end", at_end_result)
    streamed = engine(fail_at_step=fail_at_step)
    results = ResultStream(tmp_path / "stream", streamed.trace)
    forgotten = []
    done = results.attach(streamed)

    def on_done(rid):
        done(rid)
        forgotten.append(sum(r is None for r in streamed.requests[:len(streamed.trace)]))
    result = streamed.run(on_done)
    assert max(forgotten) >= 16                  # written row groups left the engine's memory
    summary = results.finish(result)
    assert files(tmp_path / "stream") == files(tmp_path / "end")
    one_table = summarize_run(at_end_result)[2]     # (no row groups: the whole run's tokens at once)
    assert summary["fairness"] == one_table["fairness"] and summary["itl"] == one_table["itl"]
    assert summary["fairness"]["service_difference_max"] > 0    # (two clients, each backlogged)
    assert summary["partial"] is (fail_at_step is not None)
    groups = pq.ParquetFile(tmp_path / "stream" / "requests.parquet")
    assert groups.metadata.num_row_groups >= 120 // 16
    if fail_at_step is not None:
        table = pd.read_parquet(tmp_path / "stream" / "requests.parquet")
        assert (table["status"] == "finished").sum() > 16 and (table["status"] == "unfinished").any()
        assert not list((tmp_path / "stream").glob(".*.tmp"))
