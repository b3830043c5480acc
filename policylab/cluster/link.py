"""KV-transfer time between a prefill and a decode replica (DistServe §4, Splitwise §4.3).

Either latency + bytes / bandwidth, or a measured profile: Vidur's `send_recv.csv`
(a file, or a downloaded network profile's name: `cluster.link.profile=network/h100_dgx`), read as published: `size` in bytes
(Vidur divides it by 2 × hidden size to get tokens of fp16 activations), times in ms, one row per
size and `devices_per_node` (1: the two GPUs on different nodes, 2: on one node). The median
time is interpolated linearly between sizes; beyond the largest size it grows in proportion,
at the throughput measured at the largest size (a KV cache of a long prompt is often larger).
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from policylab.cluster.config import LinkConfig
from policylab.datasets.cache import DatasetError, profile_path

PROFILE_COLUMNS = ("size", "devices_per_node", "collective", "time_stats.send_recv.median")


class LinkModel:
    def __init__(self, cfg: LinkConfig):
        self.cfg = cfg
        self.sizes = self.times = None
        if cfg.kind == "profile":
            self.sizes, self.times = read_send_recv(_send_recv_path(cfg.profile), cfg.devices_per_node)

    def transfer_time(self, num_bytes: float) -> float:
        """Seconds to move `num_bytes` over the link."""
        if self.sizes is None:
            return self.cfg.latency + num_bytes / self.cfg.bandwidth
        sizes, times = self.sizes, self.times
        if num_bytes <= sizes[-1]:
            return float(np.interp(num_bytes, sizes, times))
        return float(times[-1] * num_bytes / sizes[-1])      # the largest size's throughput


def _send_recv_path(value: str) -> Path:
    """A send_recv.csv path, or a downloaded network profile's name (`network/h100_dgx`)."""
    try:
        path = profile_path(str(value))
    except DatasetError as e:
        raise FileNotFoundError(f"cluster.link.profile={value}: {e}") from None
    return path / "send_recv.csv" if path.is_dir() else path


def read_send_recv(path: Path, devices_per_node: int) -> tuple:
    """(sizes in bytes, median seconds) of the send_recv rows with this devices_per_node, by size."""
    if not path.is_file():
        raise FileNotFoundError(f"cluster.link.profile: {path}: no such file")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in PROFILE_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: not a Vidur send_recv profile (missing columns {missing})")
        rows = {}
        for line, row in enumerate(reader, start=2):
            try:
                if row["collective"] != "send_recv" or int(row["devices_per_node"]) != devices_per_node:
                    continue
                rows[float(row["size"])] = float(row["time_stats.send_recv.median"]) / 1e3   # ms -> s
            except ValueError:
                raise ValueError(f"{path}, line {line}: size, devices_per_node and the median time must be "
                                 f"numbers, got {row['size']!r}, {row['devices_per_node']!r}, "
                                 f"{row['time_stats.send_recv.median']!r}") from None
    if len(rows) < 2:
        raise ValueError(f"{path}: fewer than 2 send_recv rows with devices_per_node={devices_per_node}")
    sizes = np.array(sorted(rows))
    return sizes, np.array([rows[s] for s in sizes])
