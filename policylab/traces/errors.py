"""One error type for every bad trace input, naming where the problem is."""
from __future__ import annotations

from typing import Optional


class TraceError(ValueError):
    """Bad trace input: `file:line: field 'x': message` (line/field left out when unknown).

    CSV readers pass kind="column" so the message says which column is wrong.
    """

    def __init__(self, file, line: Optional[int], field: Optional[str], message: str,
                 *, kind: str = "field"):
        self.file, self.line, self.field, self.message, self.kind = str(file), line, field, message, kind
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        what = f" {self.kind} '{self.field}':" if self.field else ""
        return f"{where}:{what} {self.message}"

    def __reduce__(self):   # keep it picklable (multiprocessing sweeps)
        return (_rebuild, (self.file, self.line, self.field, self.message, self.kind))


def _rebuild(file, line, field, message, kind):
    return TraceError(file, line, field, message, kind=kind)


def shown(value, limit: int = 40) -> str:
    """A bad value as the message shows it: strings quoted, long ones cut."""
    text = f'"{value}"' if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
