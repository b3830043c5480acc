"""The suite's per-test timeout: a test that hangs fails instead of stalling the run."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STUCK = '''
def test_stuck():
    while True:                      # a loop that swallows what a signal-based timeout raises
        try:
            sum(range(1000))
        except BaseException:
            pass
'''


def test_the_suite_has_a_default_timeout_that_ends_any_hang():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < int(options["timeout"]) <= 900 and options["timeout_method"] == "thread"
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert any(d.startswith("pytest-timeout") for d in dev)


def test_a_hanging_test_fails_under_the_suites_settings(tmp_path):
    (tmp_path / "test_stuck.py").write_text(STUCK)
    done = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                           str(tmp_path), "-o", "timeout=2", "-p", "no:cacheprovider", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode != 0 and "Timeout" in done.stdout + done.stderr, done.stdout[-2000:]
