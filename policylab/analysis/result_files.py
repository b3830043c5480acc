"""Writing result files: whole or absent, never half-written (a full disk names the file).

Shared by `results` (a finished run's files at once) and `result_stream` (row groups as a run
goes): arrow conversion of the request table, the typed config sections, atomic writes.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from policylab.analysis.metrics import flat_token_times
from policylab.core.config import FairnessConfig, QoeConfig, SloConfig


class ResultsWriteError(Exception):
    """A result file could not be written (full disk, no permission, …); names the file."""


def requests_arrow(requests, flat: tuple | None = None) -> pa.Table:
    """Arrow table whose `token_times` is list<double>, built from one flat array (fast; `flat`:
    the column's `flat_token_times`, if the caller has it already)."""
    times, rows = flat or flat_token_times(requests["token_times"].tolist())
    offsets = np.zeros(len(requests) + 1, dtype=np.int32)
    np.cumsum(np.bincount(rows, minlength=len(requests)), out=offsets[1:])
    table = pa.Table.from_pandas(requests.drop(columns="token_times"), preserve_index=False)
    return table.append_column("token_times", pa.ListArray.from_arrays(offsets, times))


@dataclasses.dataclass(frozen=True)
class ResultSettings:
    """What the result files take from a run's config, made once by the app layer (`apps.config.
    result_settings`): the SLOs, fairness weights and QoE expectations the metrics use, and the resolved config that
    summary.json echoes (None: no echo)."""
    slo: SloConfig = dataclasses.field(default_factory=SloConfig)
    fairness: FairnessConfig = dataclasses.field(default_factory=FairnessConfig)
    config: dict | None = None
    qoe: QoeConfig = dataclasses.field(default_factory=QoeConfig)


def atomic_write(path: Path, write: Callable) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")   # (per process: concurrent writers)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, OverflowError, ValueError, pa.ArrowException) as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        why = getattr(e, "strerror", None) or f"{type(e).__name__}: {e}"
        raise ResultsWriteError(f"could not write results file {path}: {why}") from e
