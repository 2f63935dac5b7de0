"""Reading this process's cgroup (v1 or v2): where its folders are and the limits set on them.

Each reader takes the file's path (or the root it lies under) as a parameter, so tests point it at
fixture files.
"""

from __future__ import annotations

import os
from pathlib import Path

UNLIMITED_V1 = 1 << 62  # cgroup v1 writes "no limit" as a huge number (PAGE_COUNTER_MAX pages)


def read_text(path: str | os.PathLike[str]) -> str | None:
    """A small system file's text, None when it cannot be read."""
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None

def read_self_cgroup(path: str | os.PathLike[str] = "/proc/self/cgroup") -> dict[str, str]:
    """Controller → this process's cgroup path; the cgroup v2 entry is under the key ``""``."""
    groups: dict[str, str] = {}
    for line in (read_text(path) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                groups[controller] = parts[2]
    return groups

def cgroup_version(cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup") -> int:
    """2 for the unified hierarchy, 1 for per-controller folders, 0 when there is none."""
    root = Path(cgroup_root)
    if (root / "cgroup.controllers").is_file():
        return 2
    return 1 if root.is_dir() and any(root.iterdir()) else 0

def v1_controller_dir(root: Path, controller: str) -> Path | None:
    """The v1 hierarchy holding ``controller`` (``cpu`` may be mounted as ``cpu,cpuacct``)."""
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return None
    for entry in entries:
        if entry.is_dir() and controller in entry.name.split(","):
            return entry
    return None

def cgroup_dirs(base: Path, rel: str) -> list[Path]:
    """``base/rel`` and each ancestor up to ``base``, those that exist: a limit set on any of them applies."""
    dirs = [base]
    current = base
    for part in [p for p in rel.split("/") if p]:
        current = current / part
        dirs.append(current)
    return [d for d in dirs if d.is_dir()]

def min_limit(values: list[float | None]) -> float | None:
    limits = [v for v in values if v is not None]
    return min(limits) if limits else None
