"""`trace download NAME` / `profile download NAME` / `... list`: the public datasets by name.

  python -m policylab trace list
  python -m policylab trace download azure_code          # then: run trace=azure_code
  python -m policylab profile download a100/meta-llama/Meta-Llama-3-8B
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional

from policylab.datasets.cache import COMMAND, DatasetError, cache_root
from policylab.datasets.catalog import CATALOGS, FIRST_DOWNLOAD
from policylab.datasets.download import download, verify


def add_commands(sub, kind: str) -> None:
    """The `download` and `list` subcommands of the `trace` or `profile` tool."""
    d = sub.add_parser("download", help=f"fetch public {kind}s into the cache (sha256-checked)",
                       description=f"Fetch {kind}s from their published URLs into the cache "
                                   "($POLICYLAB_CACHE, else ~/.cache/policylab).")
    d.add_argument("names", nargs="+", metavar="NAME", help=f"{kind} name(s): see `{kind} list`")
    d.add_argument("--cache-dir", help="cache root (default: $POLICYLAB_CACHE, else ~/.cache/policylab)")
    d.add_argument("--mirror", help="fetch <MIRROR>/<cache path> instead of the publisher's URL "
                                    "(default: $POLICYLAB_MIRROR)")
    d.add_argument("--force", action="store_true", help="download again even when cached and valid")
    d.add_argument("--timeout", type=float, default=60.0, help="seconds without data before giving up")
    d.set_defaults(run=lambda a: cmd_download(a, kind))
    ls = sub.add_parser("list", help=f"the downloadable {kind}s and whether each is cached")
    ls.add_argument("--cache-dir")
    ls.set_defaults(run=lambda a: cmd_list(a, kind))


def cmd_download(a, kind: str) -> int:
    for name in a.names:
        path = download(kind, name, a.cache_dir, a.mirror, a.force, a.timeout)
        use = f"trace={name}" if kind == "trace" else f"dataplane.profile={name}" if not name.startswith(
            "network/") else f"dataplane.network_profile={name} or cluster.link.profile={name}"
        print(f"ready    {name}: {path}  (use: {use})")
    return 0


def cmd_list(a, kind: str) -> int:
    root = cache_root(a.cache_dir)
    print(f"cache: {root}")
    for name, ds in sorted(CATALOGS[kind].items()):
        states = {s for _, s in verify(kind, name, a.cache_dir)}
        state = "cached" if states == {"ok"} else "missing" if states == {"missing"} else \
            "unverified" if states <= {"ok", "unverified"} else "incomplete"
        pinned = " (checksum pinned on first download)" if any(f.verified == FIRST_DOWNLOAD
                                                               for f in ds.files) else ""
        print(f"  {name:<42} {state:<10} {ds.description}{pinned}")
    print(f"download: {COMMAND[kind]} NAME")
    return 0


def main(argv: Optional[list] = None) -> int:
    """`python -m policylab profile ...`."""
    p = argparse.ArgumentParser(prog="python -m policylab profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="{download,list}")
    add_commands(sub, "profile")
    args = p.parse_args(argv)
    try:
        return args.run(args)
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
