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

from policylab.analysis.metrics import flat_token_times, json_safe


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


def section(cfg, name: str, cls):
    """`cfg.<name>` as the dataclass `cls`, whatever container the config came in."""
    if cfg is None:
        return cls()
    node = cfg.get(name) if hasattr(cfg, "get") else getattr(cfg, name, None)
    if node is None:
        return cls()
    if isinstance(node, cls):
        return node
    return cls(**{f.name: node[f.name] for f in dataclasses.fields(cls) if f.name in node})


def plain_config(cfg):
    """The resolved config as plain JSON-ready containers (None when no config was given)."""
    if cfg is None:
        return None
    if dataclasses.is_dataclass(cfg):
        return json_safe(dataclasses.asdict(cfg))
    return json_safe(dict(cfg))


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
