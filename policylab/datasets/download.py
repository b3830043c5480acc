"""Fetch a dataset's files into the cache: streamed to a temporary file beside the target,
checked (length and sha256), then renamed into place, so an interrupted or corrupted download
never leaves a file a run would read.

`mirror` (or `$POLICYLAB_MIRROR`) replaces the publisher's URLs by `<mirror>/<cache path>`: a
lab-local copy of the cache layout, or a test server."""
from __future__ import annotations

import http.client
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Optional

from policylab.datasets.cache import DatasetError, cache_root, expected_sha256, file_ok, lookup, sha256_file
from policylab.datasets.catalog import Dataset, RemoteFile

CHUNK = 1 << 16
FORMATS = ("azure", "mooncake", "burstgpt", "vidur")     # configs/trace/<format>.yaml reads a file by path


class DownloadFailed(DatasetError):
    """The network refused (offline, DNS, a proxy): the message says how to get the file by hand."""


def source_url(f: RemoteFile, mirror: Optional[str]) -> str:
    mirror = mirror or os.environ.get("POLICYLAB_MIRROR")
    return f"{mirror.rstrip('/')}/{f.path}" if mirror else f.url


def download(kind: str, name: str, cache_dir: Optional[str] = None, mirror: Optional[str] = None,
             force: bool = False, timeout: float = 60.0, say: Callable[[str], None] = print) -> Path:
    """Download every file of `name` not already cached and valid; returns the local trace/profile path."""
    ds: Dataset = lookup(kind, name)
    root = cache_root(cache_dir)
    for f in ds.files:
        target = root / f.path
        if not force and file_ok(root, f):
            say(f"cached   {target} (sha256 ok)")
            continue
        url = source_url(f, mirror)
        try:
            digest, size = _fetch(url, target, f.sha256 or (None if force else expected_sha256(root, f)), timeout)
        except DownloadFailed as e:
            raise DownloadFailed(f"{e}\n{by_hand(ds, f, url, target)}") from None
        if f.sha256 is None:
            (root / (f.path + ".sha256")).write_text(f"{digest}  {Path(f.path).name}\n")
            say(f"fetched  {target} ({size:,} bytes; no published checksum: sha256 {digest} recorded)")
        else:
            say(f"fetched  {target} ({size:,} bytes, sha256 ok)")
    return root / ds.local


def _fetch(url: str, target: Path, sha256: Optional[str], timeout: float) -> tuple:
    """Stream `url` to `target` atomically; returns (sha256, bytes). Nothing is left on failure."""
    import hashlib
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
    digest, size = hashlib.sha256(), 0
    try:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response, open(tmp, "wb") as out:
                expected = response.headers.get("Content-Length")
                while chunk := response.read(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
        except urllib.error.HTTPError as e:
            raise DatasetError(f"{url}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
            reason = getattr(e, "reason", e)
            raise DownloadFailed(f"{url}: download failed ({reason}); nothing was kept") from None
        if expected is not None and size != int(expected):
            raise DatasetError(f"{url}: connection closed after {size:,} of {int(expected):,} bytes; "
                               "nothing was kept: run the command again")
        got = digest.hexdigest()
        if sha256 is not None and got != sha256:
            raise DatasetError(f"{url}: sha256 mismatch (expected {sha256}, got {got}); nothing was kept")
        os.replace(tmp, target)
        return got, size
    finally:
        tmp.unlink(missing_ok=True)


def by_hand(ds: Dataset, f: RemoteFile, url: str, target: Path) -> str:
    """What to do without a network from here: fetch the URL elsewhere, then read the file where
    it lies, or put it where the dataset's name finds it."""
    steps = [f"offline? fetch {url} by hand (a browser, or curl -L -o {Path(f.path).name} {url}), then"]
    if ds.kind == "trace":
        fmt = ds.name.split("_")[0]
        if fmt in FORMATS:
            steps.append(f"  read it where it is:  python -m policylab run trace={fmt} trace.path=FILE")
        steps.append(f"  or save it as {target}: then trace={ds.name} finds it (its sha256 is checked)")
    else:
        steps.append(f"  save it as {target}: then dataplane.profile={ds.name} finds it (its sha256 is checked)")
    return "\n".join(steps)


def verify(kind: str, name: str, cache_dir: Optional[str] = None) -> list:
    """(path, status) of each file of `name` in the cache: ok, missing, unverified (no checksum
    to check it by: not fetched by `download`), or mismatch."""
    ds = lookup(kind, name)
    root = cache_root(cache_dir)
    out = []
    for f in ds.files:
        path = root / f.path
        status = "missing" if not path.is_file() else "unverified" if expected_sha256(root, f) is None else \
            "ok" if file_ok(root, f) else "mismatch"
        out.append((path, status))
    return out


