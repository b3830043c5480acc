"""A full disk: the small files are still written and say what is missing, no temporary file is
left, and the message names the file that failed. An injected ENOSPC always runs; the same on a
real small tmpfs where the machine lets the test mount one."""
from __future__ import annotations

import errno
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import policylab.analysis.result_stream as result_stream
from policylab.apps.cli import main

ROOT = Path(__file__).resolve().parent.parent
BASE = ["run", "dataplane=sim", "logger=none", "progress=false", "trace=poisson"]


class FillingFile(io.FileIO):
    """A file on a disk that fills after `LIMIT` bytes: writes then fail with ENOSPC, and so does
    the flush a buffered file's close() does, as on a real full disk."""
    LIMIT = 3000

    def write(self, data):
        if self.tell() + len(data) > self.LIMIT:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)


def test_a_disk_that_fills_during_the_run_keeps_the_summary_and_names_the_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(result_stream, "open", lambda path, mode: io.BufferedWriter(FillingFile(path, "wb")),
                        raising=False)
    with pytest.raises(SystemExit) as stop:
        main([*BASE, "plots=false", f"hydra.run.dir={tmp_path}"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert f"could not write results file {tmp_path / 'requests.parquet'}: No space left on device" in err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["counts"]["finished"] == 300
    assert set(summary["missing_files"]) == {"requests.parquet", "steps.parquet"}
    assert not list(tmp_path.glob(".*tmp")) and not (tmp_path / "requests.parquet").exists()
    assert "requests.parquet" in (tmp_path / "error.txt").read_text()


def cli(run_dir: Path, *overrides) -> tuple:
    done = subprocess.run([sys.executable, "-m", "policylab", *BASE, *overrides, f"hydra.run.dir={run_dir}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    return done.returncode, done.stderr


# tmpfs counts whole 4 KB pages: 24k holds Hydra's three files, the log and a summary, never a parquet file
@pytest.mark.slow
@pytest.mark.parametrize("size", ["24k", "100k"])
def test_a_tiny_filesystem_keeps_the_summary_marked_with_what_is_missing(tmpfs, size):
    run_dir = tmpfs(size)
    code, err = cli(run_dir, "plots=false")
    assert code == 2 and f"{run_dir / 'requests.parquet'}: No space left on device" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["counts"]["requests"] == 300 and "requests.parquet" in summary["missing_files"]
    assert not list(run_dir.glob(".*tmp"))
    error = run_dir / "error.txt"
    assert not error.exists() or "requests.parquet" in error.read_text()     # never an empty one


@pytest.mark.slow
def test_results_that_fit_when_plots_do_not_are_a_complete_run_with_a_warning(tmpfs):
    run_dir = tmpfs("420k")
    code, err = cli(run_dir, "plots=true")
    assert code == 0, err[-2000:]
    assert "warning: plots not all written (could not write" in err and ".png: No space left on device" in err
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "complete"
    assert not (run_dir / "error.txt").exists()
    assert not list(run_dir.glob(".*tmp"))


def test_a_summary_that_only_fits_without_its_config_says_what_it_left_out(tmp_path, monkeypatch):
    from policylab.analysis.result_files import ResultsWriteError, atomic_write
    room = 4000                               # bytes left: the numbers fit, the config echo does not

    def nearly_full(path, write):
        if path.name != "summary.json":
            return atomic_write(path, write)
        data = io.BytesIO()
        write(data)
        if len(data.getvalue()) > room:
            try:
                raise OSError(errno.ENOSPC, "No space left on device")
            except OSError as e:
                raise ResultsWriteError(f"could not write results file {path}: {e.strerror}") from e
        return atomic_write(path, lambda f: f.write(data.getvalue()))
    monkeypatch.setattr(result_stream, "atomic_write", nearly_full)
    main([*BASE, "plots=false", "trace.max_requests=30", f"hydra.run.dir={tmp_path}"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["omitted_for_space"] == ["config"] and summary["config"] is None
    assert summary["status"] == "complete" and summary["counts"]["finished"] == 30
    assert not list(tmp_path.glob(".*tmp"))
