"""What a run shows and writes: plot formats and log axes, progress lines of side-by-side jobs,
a contract violation naming its step, and a failing pressure scenario printed as code."""
from __future__ import annotations

import json
import re

import pytest
from hydra import compose, initialize_config_dir
from matplotlib.figure import Figure

from policies.prefill_first import PrefillFirst
from policylab.analysis.plots import PlotSettings, cdf_row, line_styles, write_run_plots
from policylab.apps.cli import CONFIG_DIR, quoted_list
from policylab.apps.config import ConfigError, plot_settings
from policylab.apps.jobs import ProgressLines
from policylab.apps.run import run
from policylab.core.config import EngineConfig
from policylab.core.contract import StepPlan
from policylab.core.request import TraceRequest
from policylab.testing.harness import Scenario
from policylab.testing import suite
from policylab.testing.suite import pressure_scenario
from tests.test_plots_compare import make_run_dir

pytestmark = pytest.mark.timeout(120)


def config(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=["trace=bursty", "dataplane=sim", "logger=none", "progress=false",
                                            *overrides])


@pytest.mark.slow
def test_plots_in_every_requested_format(tmp_path):
    settings = plot_settings(config("plots.format='png,svg,pdf'", "trace.max_requests=30").plots)
    assert settings.formats == ("png", "svg", "pdf") and settings.log_latency
    paths = write_run_plots(make_run_dir(tmp_path, n=30), settings)
    assert sorted(p.name for p in paths) == sorted(f"{stem}.{fmt}" for stem in
                                                   ("latency_cdf", "latency_over_time", "timeline")
                                                   for fmt in ("png", "svg", "pdf"))
    assert (tmp_path / "latency_cdf.svg").read_text().lstrip().startswith("<?xml")
    assert (tmp_path / "latency_cdf.pdf").read_bytes().startswith(b"%PDF")
    assert plot_settings(False).enabled is False and plot_settings(True).formats == ("png",)
    with pytest.raises(ConfigError, match="plots.format=gif"):
        plot_settings({"format": "gif"})
    assert quoted_list("plots.format=png,svg", "plots.format=") == "plots.format='png,svg'"


def test_log_latency_puts_latency_axes_on_a_log_scale():
    samples = {"run": {"TTFT": [0.01, 0.02, 0.03, 0.05], "TPOT": [0.01, 0.011], "ITL": [0.01, 0.012]}}
    for log, scale in ((True, "log"), (None, "linear")):      # None: log only for a heavy tail
        axes = Figure().subplots(1, 3)
        cdf_row(axes, samples, {}, line_styles(["run"]), log=log)
        assert {ax.get_xscale() for ax in axes} == {scale}


def test_progress_lines_are_whole_lines_at_each_quarter(capsys):
    seen = []
    progress = ProgressLines(10, "3_chunked_bursty", seen.append)
    for rid in range(10):
        progress(rid)
    lines = capsys.readouterr().err.splitlines()
    assert seen == list(range(10)) and "\r" not in "".join(lines)
    assert lines == [f"3_chunked_bursty: {p}% ({n}/10 requests)" for p, n in ((20, 2), (50, 5), (70, 7), (100, 10))]


class OverBudget:
    """Schedules twice the token budget at its first decision from the 5th on with a request waiting."""

    def __init__(self, name="over_budget", watermark=0.01):      # (its config is prefill_first's)
        self.name, self.inner, self.calls = name, PrefillFirst(watermark=watermark), 0

    def schedule(self, view):
        self.calls += 1
        plan = self.inner.schedule(view)
        if self.calls >= 5 and view.waiting:
            return StepPlan({view.waiting[0].req_id: 2 * view.max_num_batched_tokens + 1})
        return plan

    def on_finished(self, view):
        pass


def test_a_contract_violation_on_the_cli_names_the_step(tmp_path, capsys):
    summary = run(config(f"policy._target_={__name__}.OverBudget", "policy.name=over_budget", "plots=false"), tmp_path)
    assert summary["status"] == "partial"
    match = re.search(r"broke rule '(\w+)'.* \(at step (\d+), t=([\d.e-]+) s\)$", summary["error"])
    assert match, summary["error"]
    assert int(match[2]) >= 4
    err = capsys.readouterr().err
    assert f"at step {match[2]}" in err
    assert json.loads((tmp_path / "summary.json").read_text())["error"] == summary["error"]


class LeaksBlocks(PrefillFirst):
    """Preempts nothing and schedules every waiting prompt whole: breaks the KV rules under pressure."""

    def schedule(self, view):
        plan = super().schedule(view)
        return StepPlan({**plan.num_scheduled_tokens, **{r.req_id: r.prompt_len for r in view.waiting}})


def test_a_failing_harness_check_says_its_cause_first_and_names_a_file_that_reproduces_it(tmp_path, monkeypatch):
    """The cause on the first line, then the command that reproduces the failure and the scenario in
    one line: the scenario in full (hundreds of lines) is in the file, not in front of the cause."""
    failing_harness_check(tmp_path, monkeypatch)


def failing_harness_check(tmp_path, monkeypatch) -> tuple:
    """(the cause, the reproduction file) of LeaksBlocks under the pressure scenario, checked."""
    from pathlib import Path
    monkeypatch.setenv("POLICYLAB_FAILURES", str(tmp_path))
    with pytest.raises(pytest.fail.Exception) as failure:
        suite.test_invariants_under_kv_pressure(f"{__name__}:LeaksBlocks")
    cause, command, scenario = str(failure.value).splitlines()
    assert "broke rule" in cause or cause.startswith("[")
    assert command.startswith(f"reproduce: python {tmp_path}") and scenario.startswith("scenario: 30 requests over ")
    assert "num_blocks=40" in scenario and failure.value.pytrace is False       # no engine traceback in front
    code = Path(command.split("python ", 1)[1]).read_text()
    call = code.split("check_policy(", 1)[1].rstrip()
    rebuilt = eval(call[call.index("Scenario("):-1],
                   {"Scenario": Scenario, "EngineConfig": EngineConfig, "TraceRequest": TraceRequest})
    assert rebuilt == pressure_scenario(0)
    return cause, Path(command.split("python ", 1)[1])


@pytest.mark.slow
def test_the_file_a_harness_failure_names_reproduces_it_alone(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys
    from pathlib import Path
    cause, script = failing_harness_check(tmp_path, monkeypatch)
    here = Path(__file__).resolve().parent              # (the policy's module, as pytest imported it)
    again = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                           cwd=here if "." not in __name__ else here.parent,
                           env={**os.environ, "PYTHONPATH": str(here.parent)})
    assert again.returncode != 0 and cause.split(" (at step")[0] in again.stderr


def test_the_replay_s_engine_is_freed_before_the_plots_draw(tmp_path, monkeypatch):
    """The engine's objects hold one another in cycles: a large replay's job collects them once
    the replay is written, so the plots and W&B reuse that memory (a million requests: gigabytes)."""
    import gc
    import weakref

    import policylab.apps.run as run_module

    built, alive_at_plots = [], []
    build = run_module.build_engine
    monkeypatch.setattr(run_module, "build_engine", lambda *a, **k: built.append(weakref.ref(e := build(*a, **k))) or e)
    monkeypatch.setattr(run_module, "draw_plots", lambda *a, **k: alive_at_plots.append(built[-1]() is not None))
    gc.disable()                  # (only the job's own collection may free it)
    try:
        monkeypatch.setattr(run_module, "COLLECT_AFTER_REQUESTS", 20)     # 20 requests count as large
        run(config("trace.max_requests=20"), tmp_path, verbose=False)
    finally:
        gc.enable()
    assert alive_at_plots == [False]
