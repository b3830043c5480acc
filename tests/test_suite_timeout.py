"""The suite's per-test timeout: a test that hangs fails, alone, and the run goes on."""
from __future__ import annotations

import ast
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from policylab.apps.signals import ReplaySignals
from tests.time_limits import time_limit

ROOT = Path(__file__).resolve().parent.parent

HANGS = '''
import time

def test_sleeps_past_its_limit():
    time.sleep(600)

def test_spins_past_its_limit():
    while True:
        sum(range(1000))

def test_after_them():
    assert True
'''


def test_the_suite_has_a_default_timeout_that_fails_only_the_test():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < int(options["timeout"]) <= 900 and options["timeout_method"] == "signal"
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert any(d.startswith("pytest-timeout") for d in dev)
    assert any(m.startswith("slow:") for m in options["markers"])


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_hanging_tests_fail_and_the_run_goes_on(tmp_path):
    (tmp_path / "test_hangs.py").write_text(HANGS)
    done = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                           str(tmp_path), "-o", "timeout=2", "-p", "no:cacheprovider", "-rA", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-2000:]
    assert "FAILED test_hangs.py::test_sleeps_past_its_limit - Failed: Timeout" in out, out[-2000:]
    assert "FAILED test_hangs.py::test_spins_past_its_limit - Failed: Timeout" in out, out[-2000:]
    assert "PASSED test_hangs.py::test_after_them" in out and "Fatal Python error" not in out


def _alarm_left() -> float:
    return signal.getitimer(signal.ITIMER_REAL)[0]


def test_a_replay_and_a_time_limit_keep_the_tests_own_alarm():
    """ReplaySignals and tests/time_limits.py borrow SIGALRM: the test's own timer (pytest-timeout's,
    here armed for 300 s) keeps running through them and reaches its handler."""
    left = _alarm_left()
    assert 0 < left <= 300                       # pytest-timeout's signal method armed it
    outer = signal.getsignal(signal.SIGALRM)
    with ReplaySignals():
        pass
    with time_limit(5):
        time.sleep(0.01)
    assert signal.getsignal(signal.SIGALRM) is outer and 0 < _alarm_left() <= left

    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append("outer"))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with ReplaySignals():                   # an alarm going off in a replay is its owner's
            time.sleep(0.3)
        assert fired == ["outer"]
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with time_limit(5):                     # ... and in a longer time limit too
            time.sleep(0.3)
        assert fired == ["outer", "outer"]
        with pytest.raises(TimeoutError, match="over its 0.05 s limit"):
            with time_limit(0.05):
                time.sleep(1)
    finally:
        signal.signal(signal.SIGALRM, previous)
        signal.setitimer(signal.ITIMER_REAL, left)


def _calls_without_timeout(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        f, keywords = node.func, {k.arg for k in node.keywords}
        runs = isinstance(f.value, ast.Name) and f.value.id == "subprocess" and \
            f.attr in ("run", "check_output", "check_call", "call")
        waits = f.attr in ("communicate", "wait") and not node.args
        if (runs or waits) and "timeout" not in keywords:
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)[:60]}")
    return found


def test_every_subprocess_a_test_runs_has_a_timeout():
    """A child process that hangs fails its test by the call's own timeout, not by the suite's."""
    missing = [hit for p in sorted((ROOT / "tests").glob("*.py")) for hit in _calls_without_timeout(p)]
    assert not missing, "\n".join(missing)
