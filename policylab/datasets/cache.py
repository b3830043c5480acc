"""Where downloaded datasets live, and how a name becomes a local path.

The cache root is, first that applies: the explicit `cache_dir` (config or `--cache-dir`),
`$POLICYLAB_CACHE`, `$XDG_CACHE_HOME/policylab`, `~/.cache/policylab`. A file whose publisher
gives no checksum gets a `<file>.sha256` record on its first download; a name resolves only when
every file is present and matches its checksum (published or recorded), so a half-copied cache, or
a file put there by hand with no record to check it by, is never read."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Optional

from policylab.datasets.catalog import CATALOGS, Dataset, RemoteFile

COMMAND = {"trace": "python -m policylab trace download", "profile": "python -m policylab profile download"}


class DatasetError(Exception):
    """A dataset that is unknown, missing from the cache, or fails its checksum: one line for the user."""


def cache_root(cache_dir: Optional[str] = None) -> Path:
    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get("POLICYLAB_CACHE"):
        return Path(os.environ["POLICYLAB_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "policylab"


def lookup(kind: str, name: str) -> Dataset:
    catalog = CATALOGS[kind]
    if name not in catalog:
        from difflib import get_close_matches
        near = get_close_matches(name, catalog, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise DatasetError(f"unknown {kind} '{name}'{hint}; known: {', '.join(sorted(catalog))}")
    return catalog[name]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def expected_sha256(root: Path, f: RemoteFile) -> Optional[str]:
    """The registry's checksum, else the one recorded at the first download (None: never downloaded)."""
    if f.sha256:
        return f.sha256
    record = root / (f.path + ".sha256")
    return record.read_text().split()[0] if record.is_file() else None


def file_ok(root: Path, f: RemoteFile) -> bool:
    path = root / f.path
    want = expected_sha256(root, f)
    return path.is_file() and want is not None and sha256_file(path) == want


def resolve(kind: str, name: str, cache_dir: Optional[str] = None) -> Path:
    """The cached trace file or profile directory of `name`, or a DatasetError saying what to run."""
    ds = lookup(kind, name)
    root = cache_root(cache_dir)
    missing = [f for f in ds.files if not (root / f.path).is_file()]
    if missing:
        raise DatasetError(f"{kind} '{name}' is not downloaded (looked in {root / missing[0].path}): "
                           f"run `{COMMAND[kind]} {name}` (cache: --cache-dir or $POLICYLAB_CACHE)")
    for f in ds.files:
        want = expected_sha256(root, f)
        if want is None:                 # placed by hand: nothing to check it against
            raise DatasetError(f"{root / f.path}: no checksum to verify it by (no {Path(f.path).name}.sha256 "
                               f"record: the file was not fetched by the download command): run "
                               f"`{COMMAND[kind]} {name}` to fetch it and record its checksum")
        if _cached_digest(root / f.path) != want:
            raise DatasetError(f"{root / f.path}: sha256 does not match the {kind} '{name}' registry "
                               f"(file changed since download): run `{COMMAND[kind]} {name} --force`")
    return root / ds.local


_DIGESTS: dict = {}


def _cached_digest(path: Path) -> str:
    """sha256 of a cached file, memoised on (path, size, mtime): a sweep re-reads it once per job."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_file(path)
    return _DIGESTS[key]


def profile_path(value: str, cache_dir: Optional[str] = None) -> Path:
    """A profile setting as a path: an existing directory or file as given, else a downloadable
    profile's name (`a100/meta-llama/Meta-Llama-3-8B`, `network/h100_dgx`) resolved in the cache."""
    from policylab.datasets.catalog import PROFILES
    path = Path(value).expanduser()
    if path.exists() or value not in PROFILES:
        return path
    return resolve("profile", value, cache_dir)
