"""Every number the README shows comes from the command the README shows next to it: these tests
run those commands and compare. The first run's printout is checked on the simulator of the
same model and hardware (the same schedule as the real plane, request by request:
tests/test_first_run.py) and, in the second tier, on the real plane itself; the Results
section's sweep is run as written and compared number by number, findings included.

`python tests/test_readme.py COMPARE_DIR` prints the Results table rows and findings of a
`compare` output folder of that sweep, as the README has them.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from policylab.apps.config import CONFIG_DIR, register
from policylab.apps.run import run

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
QUIET = ["logger=none", "plots=false", "progress=false"]   # (nothing they change enters a number)
SIM_TWIN = ["dataplane=sim", "model=tiny", "hardware=cpu", "serving_engine=none"]  # the default job's steps, without the model (a CPU core runs in no serving engine)
RESULTS_METRIC = "SLO attainment (%)"
RESULTS_LOAD = 1.1                                          # the load whose findings the README quotes
FINDINGS_ON = ("SLO attainment (%)", "TPOT p99 (ms)")
register()


def readme() -> str:
    return README.read_text()


def printout_block() -> list[str]:
    """The first run's printout as the README shows it (the code block after the setup commands)."""
    block = readme().split("```\npolicy prefill_first: latency (ms)\n", 1)[1].split("```", 1)[0]
    return block.splitlines()


def numbers(text: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*\.?\d*", text)]


def shown_rows(lines: list[str]) -> dict:
    """{'TTFT': [p50, p90, p99], 'SLO attainment': [99.5], 'goodput': [9.853], ...} of printout lines."""
    rows = {}
    for line in lines:
        cells = [c.strip() for c in line.split("│") if c.strip()]
        if len(cells) >= 4:
            rows[cells[0]] = numbers(" ".join(cells[1:4]))
        for name in ("SLO attainment", "goodput"):
            if line.strip().startswith(name):
                rows[name] = numbers(line.strip()[len(name):])[:1]
    return rows


def config(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("config", overrides=[*QUIET, *overrides])


def default_plane_blocks() -> int:
    from tests.test_first_run import torch_plane_blocks
    return torch_plane_blocks(config())


@pytest.mark.timeout(300)
def test_the_first_runs_printout_is_the_default_jobs_and_chunked_itl_as_stated(tmp_path, capsys):
    shown = shown_rows(printout_block())
    assert {"TTFT", "ITL", "SLO attainment", "goodput"} <= shown.keys()
    twin = [*SIM_TWIN, f"engine.num_blocks={default_plane_blocks()}"]
    run(config(*twin), tmp_path / "default")
    printed = shown_rows(capsys.readouterr().out.splitlines())
    for name, values in shown.items():
        assert printed[name] == values, f"README's {name} row {values}, the job prints {printed[name]}"
    itl = re.search(r"run policy=chunked` replays the same trace with\s+chunked prefill: ITL p99 ([\d.]+) ms",
                    readme())
    assert itl, "the README no longer quotes chunked's ITL p99"
    summary = run(config("policy=chunked", *twin), tmp_path / "chunked")
    assert f"{summary['itl']['p99'] * 1e3:.1f}" == itl[1]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_first_runs_printout_on_the_real_plane(tmp_path, capsys):
    """`python -m policylab run` itself: the real tiny model computes every token."""
    run(config(), tmp_path / "default")
    printed = shown_rows(capsys.readouterr().out.splitlines())
    for name, values in shown_rows(printout_block()).items():
        assert printed[name] == values, f"README's {name} row {values}, the job prints {printed[name]}"


@pytest.mark.timeout(120)
def test_the_sim_check_sample_errors_as_stated(capsys):
    """`sim-check --sample` 3.3 % (2.9 %): the shipped sample's MAPE under the default cost model
    (and, in brackets, the roofline's)."""
    from policylab.apps.sim_check import main as sim_check
    stated = re.search(r"`sim-check --sample` ([\d.]+) % \(([\d.]+) %\)", readme())
    assert stated, "the README no longer quotes sim-check --sample"
    for model, value in (("shaped", stated[1]), ("roofline", stated[2])):
        sim_check(["--sample", "--cost-model", model])
        row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| all |"))
        assert row.split("|")[3].strip() == f"{value} %", row


def sweep_command() -> list[str]:
    """The Sweeps section's `run -m` command, as a list of arguments after `python -m policylab`."""
    section = readme().split("## Sweeps, on every launcher", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    first = block.split("\npython -m policylab compare", 1)[0]
    args = shlex.split(first.replace("\\\n", " "), comments=True)
    assert args[:3] == ["python", "-m", "policylab"], args
    return args[3:]


def results_rows(table: pd.DataFrame) -> list[str]:
    """The README's Results rows: per load, each policy's SLO attainment as compare shows it."""
    from policylab.analysis.report import cell_text
    rows = []
    for load, group in table.groupby("capacity_load", sort=True):
        cells = {r.label: cell_text(getattr(r, "mean"), getattr(r, "low"), getattr(r, "high"), 1)
                 for r in group.rename(columns={RESULTS_METRIC: "mean", f"{RESULTS_METRIC} low": "low",
                                                f"{RESULTS_METRIC} high": "high"}).itertuples()}
        rows.append(f"| {load:g} | " + " | ".join(cells[p] for p in ("prefill_first", "chunked", "slo_aware")) + " |")
    return rows


def quoted_findings(findings: list[str]) -> list[str]:
    return [f for f in findings if f.startswith(f"multitenant at load {RESULTS_LOAD:g} of capacity")
            and any(f"{m} (" in f for m in FINDINGS_ON)]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_readme_sweep_gives_the_readme_results(tmp_path):
    sweep = tmp_path / "sweep"
    done = subprocess.run([sys.executable, "-m", "policylab", *sweep_command(), f"hydra.sweep.dir={sweep}",
                           "plots=false", "progress=false"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=540, env={**__import__("os").environ, "POLICYLAB_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr[-3000:]
    from policylab.analysis.compare import main as compare_main
    assert compare_main([str(sweep), "-o", str(tmp_path / "cmp")], verbose=False) == 0
    table = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    text = readme()
    for row in results_rows(table):
        assert row in text, f"the README's Results table lacks {row}"
    found = (tmp_path / "cmp" / "findings.txt").read_text().splitlines()
    shown = text.split("`compare`'s findings at load", 1)[1].split("```\n", 1)[1].split("```", 1)[0].splitlines()
    assert shown and shown == quoted_findings(found)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    print("\n".join(results_rows(pd.read_csv(out / "compare.csv"))))
    print("\n".join(quoted_findings((out / "findings.txt").read_text().splitlines())))
