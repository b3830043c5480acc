"""Disk space for a memory-mapped file, found before it is written.

A page of a mapped file that the filesystem cannot back is not an `OSError`: the kernel sends
SIGBUS at the write, and the process dies with no message and no results. So a mapped file's
space is checked against the free space when the run starts (`check_free`), and reserved when
the file is made (`reserve`: `posix_fallocate` allocates every block, or fails with ENOSPC as an
ordinary exception the engine turns into a partial run with its results written).
"""
from __future__ import annotations

import errno
import os
import shutil
import tempfile


def folder_of(directory: str | None) -> str:
    """Where a mapped file goes: `directory`, or the temporary folder when None."""
    return directory or tempfile.gettempdir()


def check_free(directory: str | None, need: float, what: str) -> None:
    """Refuse, before the run, a file of `need` bytes the folder has no room for (ValueError
    starting with `what`, the config keys that asked for it)."""
    folder = folder_of(directory)
    try:
        free = shutil.disk_usage(folder).free
    except OSError as e:
        raise ValueError(f"{what}: cannot use {folder} ({e.strerror or e})") from None
    if need > free:
        raise ValueError(f"{what}: its file needs {_size(need)} in {folder}, which has {_size(free)} free "
                         "(fewer blocks, or a folder on a disk with room)")


def reserve(fd: int, nbytes: int, path: str, what: str) -> None:
    """Allocate `nbytes` of the open file `fd` now, so no later write into its mapping can fail;
    an OSError naming `what` when the disk has no room for them."""
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):      # a filesystem without allocation:
            return                                           # the start's check of free space stands
        raise OSError(e.errno, f"{what}: could not reserve {_size(nbytes)} for its file in "
                               f"{os.path.dirname(path)} ({e.strerror})") from None


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
