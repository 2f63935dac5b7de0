"""How many CPUs this process can keep busy: its affinity mask, capped by a cgroup CPU quota.

The one place packload counts CPUs: the packer's worker pool, ``PackLoader``'s threads, the tuner's
ladder and ``doctor`` all ask here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from packload.core.cgroups import (
    cgroup_dirs,
    cgroup_version,
    min_limit,
    read_self_cgroup,
    read_text,
    v1_controller_dir,
)


def _parse_cpu_max(text: str) -> float | None:
    """cgroup v2 ``cpu.max`` (``"max 100000"`` or ``"200000 100000"``) → CPUs, None for no limit."""
    fields = text.split()
    if not fields or fields[0] == "max":
        return None
    period = int(fields[1]) if len(fields) > 1 else 100000
    return int(fields[0]) / period if period > 0 else None

def cgroup_cpu_limit(cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
                     self_cgroup: str | os.PathLike[str] = "/proc/self/cgroup") -> float | None:
    """CPUs the cgroup quota allows (``cpu.max`` or ``cpu.cfs_quota_us / cpu.cfs_period_us``), None if none."""
    root, groups = Path(cgroup_root), read_self_cgroup(self_cgroup)
    if cgroup_version(root) == 2:
        return min_limit([_parse_cpu_max(read_text(d / "cpu.max") or "max")
                           for d in cgroup_dirs(root, groups.get("", ""))])
    base = v1_controller_dir(root, "cpu")
    if base is None:
        return None
    values: list[float | None] = []
    for d in cgroup_dirs(base, groups.get("cpu", "")):
        quota, period = read_text(d / "cpu.cfs_quota_us"), read_text(d / "cpu.cfs_period_us")
        if quota and period and int(quota) > 0 and int(period) > 0:
            values.append(int(quota) / int(period))
    return min_limit(values)

def physical_cores(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> int | None:
    """Distinct (package, core) pairs in ``/proc/cpuinfo``; None when it does not say."""
    cores: set[tuple[str, str]] = set()
    for block in (read_text(cpuinfo) or "").split("\n\n"):
        fields = dict(re.findall(r"^([^\t:\n]+?)\s*:\s*(.*)$", block, re.MULTILINE))
        if "core id" in fields:
            cores.add((fields.get("physical id", "0"), fields["core id"]))
    return len(cores) or None

def usable_cpus(affinity: int, quota: float | None) -> float:
    """CPUs this process can really keep busy: its affinity mask, capped by the cgroup quota."""
    return min(float(affinity), quota) if quota is not None else float(affinity)


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (``os.cpu_count()`` where the platform has no mask)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def usable_cores() -> int:
    """Whole CPUs this process may use: its affinity, reduced by a cgroup CPU quota (v2 or v1) when set."""
    return max(1, int(usable_cpus(affinity_cpus(), cgroup_cpu_limit())))
