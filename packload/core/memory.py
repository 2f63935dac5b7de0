"""How much memory this process has: RAM from ``/proc/meminfo``, capped by its cgroup's limit."""

from __future__ import annotations

import os
import re
from pathlib import Path

from packload.core.cgroups import (
    UNLIMITED_V1,
    cgroup_dirs,
    cgroup_version,
    min_limit,
    read_self_cgroup,
    read_text,
    v1_controller_dir,
)

KIB = 1 << 10


def read_meminfo(path: str | os.PathLike[str] = "/proc/meminfo") -> dict[str, int]:
    """``/proc/meminfo`` as a dict, kB values converted to bytes ({} when unreadable)."""
    info: dict[str, int] = {}
    for line in (read_text(path) or "").splitlines():
        match = re.match(r"(\S+):\s+(\d+)(?:\s+kB)?", line)
        if match:
            info[match.group(1)] = int(match.group(2)) * (KIB if line.rstrip().endswith("kB") else 1)
    return info

def _parse_memory_limit(text: str | None, unlimited_from: int) -> int | None:
    text = (text or "").strip()
    if not text or text == "max" or not text.isdigit() or int(text) >= unlimited_from:
        return None
    return int(text)

def cgroup_memory_limit(cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
                        self_cgroup: str | os.PathLike[str] = "/proc/self/cgroup") -> int | None:
    """Bytes the cgroup lets this process use (``memory.max`` or ``memory.limit_in_bytes``), None if none."""
    root, groups = Path(cgroup_root), read_self_cgroup(self_cgroup)
    if cgroup_version(root) == 2:
        values = [_parse_memory_limit(read_text(d / "memory.max"), 1 << 63)
                  for d in cgroup_dirs(root, groups.get("", ""))]
    else:
        base = v1_controller_dir(root, "memory")
        dirs = cgroup_dirs(base, groups.get("memory", "")) if base is not None else []
        values = [_parse_memory_limit(read_text(d / "memory.limit_in_bytes"), UNLIMITED_V1) for d in dirs]
    limit = min_limit([float(v) if v is not None else None for v in values])
    return int(limit) if limit is not None else None

def cgroup_memory_usage(cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
                        self_cgroup: str | os.PathLike[str] = "/proc/self/cgroup") -> int | None:
    """Bytes this process's cgroup uses now (``memory.current`` or ``memory.usage_in_bytes``)."""
    root, groups = Path(cgroup_root), read_self_cgroup(self_cgroup)
    if cgroup_version(root) == 2:
        dirs, name = cgroup_dirs(root, groups.get("", "")), "memory.current"
    else:
        base = v1_controller_dir(root, "memory")
        dirs = cgroup_dirs(base, groups.get("memory", "")) if base is not None else []
        name = "memory.usage_in_bytes"
    text = (read_text(dirs[-1] / name) or "").strip() if dirs else ""
    return int(text) if text.isdigit() else None


def memory_status() -> dict[str, int]:
    """``total`` and ``available`` bytes for this process: RAM, or its cgroup limit when lower."""
    info = read_meminfo()
    if "MemAvailable" not in info:  # not Linux: psutil if installed, else assume nothing is used
        try:
            import psutil

            memory = psutil.virtual_memory()
            info = {"MemTotal": memory.total, "MemAvailable": memory.available}
        except ImportError:
            pass
    total = info.get("MemTotal") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    available = info.get("MemAvailable", total)
    limit = cgroup_memory_limit()
    if limit is not None:
        usage = cgroup_memory_usage() or 0
        total, available = min(total, limit), min(available, max(0, limit - usage))
    return {"total": int(total), "available": int(available)}
