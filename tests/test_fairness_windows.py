"""Windowed fairness: VTC's service difference between backlogged clients and a windowed Jain
index, on hand-computed event streams and on `multitenant` where clients queue."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from policylab.analysis.client_fairness import Events
from policylab.analysis.compare import main as compare_main
from policylab.analysis.fairness_windows import backlogged_throughout, window_fairness
from policylab.apps.cli import CONFIG_DIR
from policylab.apps.run import run

pytestmark = pytest.mark.timeout(180)


def ev(*rows) -> Events:
    time, client, value = zip(*rows) if rows else ((), (), ())
    return Events(np.array(time, float), np.array(client, int), np.array(value, float))


def test_backlogged_throughout_needs_an_open_request_at_every_instant():
    # client 0: open [0, 10); client 1: open [0, 3) and [3, 10) (a finish and an arrival at 3: no gap);
    # client 2: open [0, 4) then [6, 10): a gap inside the second window
    backlog = ev((0, 0, 1), (10, 0, -1), (0, 1, 1), (3, 1, -1), (3, 1, 1), (10, 1, -1),
                 (0, 2, 1), (4, 2, -1), (6, 2, 1), (10, 2, -1))
    got = backlogged_throughout(backlog, 3, np.array([0.0, 2.5, 5.0, 7.5, 10.0]))
    assert got.tolist() == [[True, True, True], [True, True, False], [True, True, False], [True, True, True]]


def test_window_service_difference_and_jain_by_hand():
    """Two clients backlogged for the whole 10 s: 0 gets 3 units per 5 s window, 1 gets 1 (window 1)
    and 3 (window 2); a third client arrives late and is never backlogged throughout a window."""
    backlog = ev((0, 0, 1), (10, 0, -1), (0, 1, 1), (10, 1, -1), (7, 2, 1), (9, 2, -1))
    service = ev((1, 0, 3), (2, 1, 1), (6, 0, 3), (8, 1, 3), (8, 2, 50))
    got = window_fairness(service, backlog, 3, 0.0, 10.0, window=5.0)
    assert got["windows"] == 2 and got["contended_windows"] == 2 and got["window_s"] == 5.0
    assert got["service_difference_max"] == 2.0 and got["service_difference_mean"] == 1.0
    jain_first = (3 + 1) ** 2 / (2 * (9 + 1))                  # 0.8; the second window is equal: 1.0
    assert got["jain_min"] == pytest.approx(jain_first)
    assert got["jain_mean"] == pytest.approx((jain_first + 1.0) / 2)


def test_no_contention_leaves_the_windows_undefined():
    backlog = ev((0, 0, 1), (4, 0, -1), (5, 1, 1), (9, 1, -1))      # one client at a time
    got = window_fairness(ev((1, 0, 2), (6, 1, 2)), backlog, 2, 0.0, 10.0)
    assert got["windows"] == 20 and got["contended_windows"] == 0 and got["jain_mean"] is None
    assert window_fairness(ev(), ev(), 1, 0.0, 10.0)["windows"] == 0


def config(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=["trace=multitenant", "dataplane=sim", "logger=none", "progress=false",
                                            "plots=false", *overrides])


# four requests at a time: the 'flooder' (4x the others' rate) keeps a queue, so who is admitted matters
BACKLOGGED = ("trace.rate_scale=2", "engine.max_num_seqs=4")


def test_vtc_and_prefill_first_differ_visibly_on_multitenant_when_clients_are_backlogged(tmp_path, capsys):
    fcfs = run(config("policy=prefill_first", *BACKLOGGED), tmp_path / "0_prefill_first")
    vtc = run(config("policy=fairness", *BACKLOGGED), tmp_path / "1_fairness")
    # the whole-run index cannot tell them apart: everyone is served in the end
    assert fcfs["fairness"]["jain_index"] == pytest.approx(1.0, abs=0.01)
    assert vtc["fairness"]["jain_index"] == pytest.approx(1.0, abs=0.01)
    f, v = fcfs["fairness_windows"], vtc["fairness_windows"]
    assert f["contended_windows"] >= 10 and v["contended_windows"] >= 3
    assert v["jain_mean"] > f["jain_mean"] + 0.2                 # measured: 0.96 against 0.60
    assert v["service_difference_mean"] < 0.5 * f["service_difference_mean"]   # 700 against 3,072
    out = capsys.readouterr().out
    assert "windowed Jain" in out

    assert compare_main([str(tmp_path), "-o", str(tmp_path / "cmp")]) == 0
    table = pd.read_csv(tmp_path / "cmp" / "compare.csv").set_index("label")
    assert table.loc["fairness", "Jain (windowed)"] > table.loc["prefill_first", "Jain (windowed)"] + 0.2
    assert table.loc["fairness", "service diff (windowed)"] < table.loc["prefill_first", "service diff (windowed)"]
    printed = capsys.readouterr().out
    assert "Jain" in printed
