"""Reading Vidur's profile CSVs: columns by name, numbers checked, errors that name the file,
the column and what was expected (shared by the compute, attention and network readers)."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np


class ProfileError(ValueError):
    """A profile that cannot be used: names the file, the column or value, and what was expected."""


def read_table(path: Path, required) -> dict:
    """The CSV's columns (name -> list of strings); every required column present, else ProfileError."""
    if not path.is_file():
        raise ProfileError(f"{path}: no such file (expected a Vidur profile CSV)")
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2:
        raise ProfileError(f"{path}: no data rows")
    header = rows[0]
    missing = [c for c in required if c not in header]
    if missing:
        raise ProfileError(f"{path}: missing column(s) {', '.join(missing)} (expected Vidur's profile "
                           f"format, columns like {', '.join(list(required)[:3])})")
    return {name: [r[i] for r in rows[1:] if len(r) == len(header)] for i, name in enumerate(header)}


def floats(table: dict, column: str, path: Path, rows=None) -> np.ndarray:
    """A numeric column (of the selected rows); an empty or non-numeric cell is named."""
    values = table[column] if rows is None else [v for v, keep in zip(table[column], rows) if keep]
    try:
        return np.asarray(values, dtype=float)
    except ValueError:
        bad = next(v for v in values if not _is_float(v))
        raise ProfileError(f"{path}: column {column} has '{bad}' (expected a number)") from None


def _is_float(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


def select_tp(table: dict, tp: int, path: Path) -> np.ndarray:
    workers = floats(table, "num_tensor_parallel_workers", path)
    rows = workers == tp
    if not rows.any():
        raise ProfileError(f"{path}: no rows with num_tensor_parallel_workers={tp} (dataplane.tensor_parallel); "
                           f"the file has {sorted(set(workers.astype(int).tolist()))}")
    return rows
