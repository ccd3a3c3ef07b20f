"""How much memory there is to use: the host's (available RAM, or what is left under the container's cgroup
limit when that is less) and the accelerators' (their allocators' memory_stats). What the mesh choice
(models/sharding.py) and the --batch_size check (pipeline/telemetry/memory.py) both measure against.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class MemoryRoom:
    """Bytes there are to use, and where that number comes from."""

    bytes: int
    source: str
    per_device: bool = False  # an accelerator's: each device holds its share of a call's rows


def host_memory_room(cgroup_root: str = "/sys/fs/cgroup") -> MemoryRoom:
    """psutil's available RAM, or what is left under this container's cgroup memory limit when that is less
    (psutil reports the host's memory inside a container)."""
    import psutil

    room = MemoryRoom(int(psutil.virtual_memory().available), "available RAM (psutil)")
    cgroup = cgroup_memory_room(cgroup_root)
    return cgroup if cgroup is not None and cgroup.bytes < room.bytes else room


def cgroup_memory_room(root: str = "/sys/fs/cgroup") -> MemoryRoom | None:
    """limit - usage of the cgroup this process runs in (v2 memory.max/memory.current, or v1
    memory/memory.limit_in_bytes/memory.usage_in_bytes); None without a limit or a cgroup to read."""
    for limit_name, usage_name in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            with open(os.path.join(root, limit_name)) as f:
                limit = f.read().strip()
            with open(os.path.join(root, usage_name)) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 2**60:  # v1 writes ~2**63 for "no limit"
            return None
        return MemoryRoom(max(0, int(limit) - usage), f"left under the cgroup memory limit ({os.path.join(root, limit_name)})")
    return None


def smallest_free(devices: Sequence[Any]) -> tuple[int, Any] | None:
    """The smallest bytes_limit - bytes_in_use of the devices' memory_stats() and that device; None when a
    device reports no limit (CPU, some backends)."""
    rooms = []
    for device in devices:
        try:
            stats = device.memory_stats()
        except Exception:  # a backend without an allocator to ask
            stats = None
        if not stats or not stats.get("bytes_limit"):
            return None
        rooms.append((max(0, int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))), device))
    return min(rooms, key=lambda r: r[0]) if rooms else None


def format_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"
