"""Result files written while the run goes, in memory that does not grow with per-token data.

`requests.parquet` gets a row group each time the first `ROWS_PER_GROUP` not yet written
requests (in req_id order: the file's row order) are all finished or rejected; the engine
then forgets them (`Engine.forget`, `Cluster.forget`), so what stays in memory is the requests in flight,
those done but behind the oldest one in flight, and per request one compact table row
(the request table without its `token_times`). What the summary needs of the tokens stays
as `TokenFacts`: the ITL gaps as distinct values with counts per slice, merged at the end
(`counted`: exact percentiles in ~16 bytes per step instead of 8 bytes per gap, 1.7 GB at a
million requests), and, when the run has several clients, per-client service events merged per
step time. `steps.parquet` gets a row group every `STEPS_PER_GROUP` steps; the steps themselves
stay in the engine's typed log (8 bytes a field).

Both files are written under a temporary name and renamed when the run ends, complete or
partial (a broken contract, an exception, Ctrl-C): as before, a result file is either
whole or absent, never half-written. A process killed outright leaves only the temporary
files.
"""
from __future__ import annotations

import errno
import json
import os
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from policylab.analysis.counted import merge
from policylab.analysis.metrics import TokenFacts, add_qoe, flat_token_times, json_safe, request_table, step_frame, \
    summarize, token_facts
from policylab.analysis.result_files import ResultSettings, ResultsWriteError, atomic_write, requests_arrow
from policylab.core.result import RunResult

ROWS_PER_GROUP = 8192        # requests per row group of requests.parquet
STEPS_PER_GROUP = 65536      # steps per row group of steps.parquet


class _ParquetFile:
    """One result file: row groups appended to a temporary file, renamed over NAME on close.

    A write that fails (full disk, ...) throws the file away and records why in `failed`; the
    run goes on, later writes to it are skipped, and the other files are still written."""

    def __init__(self, path: Path):
        self.path, self.tmp = path, path.with_name(f".{path.name}.{os.getpid()}.tmp")
        self._file = self._writer = None
        self.failed = ""

    def write(self, table: pa.Table) -> None:
        if self.failed:
            return
        try:
            if self._writer is None:
                self._file = open(self.tmp, "wb")
                self._writer = pq.ParquetWriter(self._file, table.schema)
            else:
                table = table.cast(self._writer.schema)
            self._writer.write_table(table)
        except (OSError, OverflowError, ValueError, pa.ArrowException) as e:
            self._fail(e)

    def close(self) -> None:
        if self.failed:
            return
        try:
            self._writer.close()
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.replace(self.tmp, self.path)
            self._file = self._writer = None
        except (OSError, OverflowError, ValueError, pa.ArrowException) as e:
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        self.abort()
        why = getattr(e, "strerror", None) or f"{type(e).__name__}: {e}"
        self.failed = f"could not write results file {self.path}: {why}"

    def abort(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except (OSError, ValueError, pa.ArrowException):
                pass                  # the file is being thrown away
        if self._file is not None:
            try:
                self._file.close()        # (on a full disk the close's flush fails too)
            except OSError:
                pass
        self._file = self._writer = None
        try:
            self.tmp.unlink(missing_ok=True)
        except OSError:
            pass


def write_summary(path: Path, summary: dict) -> None:
    """summary.json, indented; on a full disk compact, then without the config (it is also in
    `.hydra/config.yaml`), so that the few kilobytes left still take the run's numbers."""
    text = json.dumps(summary, indent=2, allow_nan=False, default=str) + "\n"
    try:
        atomic_write(path, lambda f: f.write(text.encode()))
        return
    except ResultsWriteError as e:
        if getattr(e.__cause__, "errno", None) not in (errno.ENOSPC, errno.EDQUOT):
            raise
        first = e
    smaller = {**summary, "config": None, "omitted_for_space": ["config"]}
    for text in (json.dumps(summary, allow_nan=False, default=str), json.dumps(smaller, allow_nan=False, default=str)):
        try:
            atomic_write(path, lambda f: f.write(text.encode() + b"\n"))
            return
        except ResultsWriteError:
            pass
    raise first


class ResultStream:
    """The result files of one run. During a replay: `attach(engine)` gives the engine's
    `on_request_done`; afterwards `finish(result)` writes the rest and returns the summary.
    `guard` (a context manager factory) wraps each write during the replay: the app passes
    one that holds stop signals back until the row group is written."""

    def __init__(self, run_dir, trace: list, settings: ResultSettings | None = None, guard=nullcontext):
        settings = settings or ResultSettings()
        self.run_dir, self.config, self.guard = Path(run_dir), settings.config, guard
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ResultsWriteError(f"cannot create results directory {self.run_dir}: {e}") from e
        self.slo, self.fairness, self.qoe = settings.slo, settings.fairness, settings.qoe
        self._requests = _ParquetFile(self.run_dir / "requests.parquet")
        self._steps = _ParquetFile(self.run_dir / "steps.parquet")
        self._done = bytearray(len(trace))     # 1: done (a byte a request; its frontier found at C level)
        self._clients = len({t.client for t in trace})       # (one: no service events to make)
        self._rows = 0               # requests written (req_ids below it)
        self._frontier = 0           # the first request not done yet
        self._written_steps = 0
        self._tables: list = []      # request table slices without token_times
        self._facts_parts: list = []     # TokenFacts per slice (ITL gaps counted, service events)
        self._engine = self._source = None

    def attach(self, engine):
        """Stream `engine`'s results as it runs; returns its `on_request_done(req_id)` callback.
        A cluster (policylab.cluster) streams its requests (with where they ran) and forgets them
        the same way; its steps, merged over the replicas in clock order, are written at the end."""
        self._engine, self._source = engine, engine.result     # (the run's result, filled as it goes)
        return self.request_done

    def request_done(self, rid: int) -> None:
        done = self._done
        done[rid] = 1
        if rid != self._frontier:
            return
        frontier = done.find(0, rid)       # the first request not done (-1: every one is)
        self._frontier = frontier = len(done) if frontier < 0 else frontier
        if frontier - self._rows < ROWS_PER_GROUP:
            return
        with self.guard():
            while frontier - self._rows >= ROWS_PER_GROUP:
                self._write_requests(self._source, self._rows + ROWS_PER_GROUP)
                self._engine.forget(self._rows)
            log = getattr(self._engine, "step_log", None)     # (a cluster's: at the end)
            if log is not None and len(log) - self._written_steps >= STEPS_PER_GROUP:
                self._write_steps(log.columns(self._written_steps, len(log)), self._source)

    def finish(self, result: RunResult, extra: dict | None = None, energy: dict | None = None) -> dict:
        """Write every request and step not written yet, then summary.json (with `extra`, and the
        `energy` section from a data plane's energy report); return the summary. Every file is
        attempted; a failure names them all at the end."""
        if not result.sections and self._source is not None:    # (a result salvaged outside the engine)
            result.sections = self._source.sections
        while True:                    # the rest, in row groups (at least one: the schema)
            self._write_requests(result, min(self._rows + ROWS_PER_GROUP, len(self._done)))
            if self._rows >= len(self._done):
                break
        self._write_steps({k: np.asarray(v)[self._written_steps:] for k, v in result.steps.items()}, result)
        self._requests.close()
        self._steps.close()
        table = pd.concat(self._tables, ignore_index=True)
        all_steps = step_frame(result.steps, 0, result)
        summary = summarize(table, all_steps, result, self.slo, self.fairness, self._facts(), self.qoe)
        if energy:                                   # a plane with a GPU power model timed the steps
            from policylab.analysis.energy_metrics import energy_section
            summary["energy"] = energy_section(energy, table, summary)
        self._tables = self._facts_parts = None      # (gigabytes at a million requests)
        self._engine = self._source = None
        summary.update(json_safe(extra or {}))
        summary["config"] = self.config
        failures = [f.failed for f in (self._requests, self._steps) if f.failed]
        if failures:
            summary["missing_files"] = [f.path.name for f in (self._requests, self._steps) if f.failed]
        try:
            write_summary(self.run_dir / "summary.json", summary)
        except ResultsWriteError as e:
            failures.append(str(e))
        if failures:
            raise ResultsWriteError("; ".join(failures))
        return summary

    def _write_requests(self, source: RunResult, stop: int) -> None:
        table = request_table(source, self.slo, self._rows, stop)
        flat = flat_token_times(table["token_times"].tolist())
        add_qoe(table, flat, self.qoe)
        self._facts_parts.append(token_facts(table, flat, services=self._clients > 1))
        if "tool_gaps" in table.columns:         # (for ITL only: the calls are in the trace)
            table = table.drop(columns="tool_gaps")
        self._requests.write(requests_arrow(table, flat))
        self._tables.append(table.drop(columns="token_times"))
        self._rows = stop

    def _write_steps(self, columns: dict, result: RunResult) -> None:
        frame = step_frame(columns, self._written_steps, result)
        if len(frame) or self._steps._writer is None:
            self._steps.write(pa.Table.from_pandas(frame, preserve_index=False))
        self._written_steps += len(frame)

    def _facts(self) -> TokenFacts:
        parts = self._facts_parts
        return TokenFacts(merge([p.itl for p in parts]), *(np.concatenate([getattr(p, f) for p in parts])
                                                           for f in TokenFacts._fields[1:]))
