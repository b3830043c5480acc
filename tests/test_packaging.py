"""A non-editable install works from any directory: the wheel carries configs/ and traces/."""
from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

REPLAY = """
import json, sys
import policylab
from policylab.apps.cli import main
try:
    main(["run", "dataplane=sim", "logger=none", "plots=false", "progress=false", "trace.max_requests=7",
          "hydra.run.dir=out"])
except SystemExit as e:
    assert not e.code, e.code
from policies.chunked import Chunked                     # shipped policies and the examples,
from policylab.examples.short_first import ShortFirst    # no PYTHONPATH to the checkout
try:
    main(["run", "policy=short_first", "hydra.searchpath=[pkg://policylab.examples]", "dataplane=sim",
          "logger=none", "plots=false", "progress=false", "trace.max_requests=5", "hydra.run.dir=example"])
except SystemExit as e:
    assert not e.code, e.code
print(json.dumps({"package": policylab.__file__, "summary": json.load(open("out/summary.json")),
                  "example": json.load(open("example/summary.json")), "subclass": issubclass(ShortFirst, Chunked)}))
"""


@pytest.mark.slow
def test_the_wheel_ships_configs_and_traces_and_replays_outside_the_repo(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(ROOT)], check=True, capture_output=True, timeout=240)
    wheel = next((tmp_path / "dist").glob("policylab-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"policylab/configs/{p.relative_to(ROOT / 'configs')}" for p in (ROOT / "configs").rglob("*.yaml")}
    assert shipped and shipped <= names, f"configs missing from the wheel: {sorted(shipped - names)[:5]}"
    assert "policylab/shipped_traces/bursty.jsonl" in names
    assert {"policylab/examples/short_first.py", "policylab/examples/policy/short_first.yaml"} <= names
    modules = {f"{p.relative_to(ROOT)}" for top in ("policylab", "policies") for p in (ROOT / top).rglob("*.py")}
    assert modules <= names, f"modules missing from the wheel (add their package to pyproject): " \
                             f"{sorted(modules - names)[:5]}"

    site, work = tmp_path / "site", tmp_path / "elsewhere"
    zipfile.ZipFile(wheel).extractall(site)         # a pure-Python wheel installs by unpacking
    work.mkdir()
    out = subprocess.run([sys.executable, "-c", REPLAY], cwd=work, env={"PYTHONPATH": str(site), "PATH": ""},
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["package"].startswith(str(site))
    assert result["summary"]["counts"]["finished"] == 7
    assert result["summary"]["config"]["trace"]["name"] == "bursty"
    assert result["example"]["policy"] == "short_first" and result["example"]["counts"]["finished"] == 5
    assert result["subclass"]
