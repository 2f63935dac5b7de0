"""Machine checks for ``packload doctor``: CPUs, memory, ``/dev/shm``, storage (and, from gpu_checks, the
GPU and PyTorch build).

Every judgement is a pure function of the facts read (``packload.core`` reads them), returning
``Check`` lines; ``collect_machine`` reads the real machine and assembles both. Each reader takes the
system file's path, so tests point it at fixture folders (``SystemPaths``).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any

from packload.core.cgroups import cgroup_version, read_text
from packload.core.cpus import affinity_cpus, cgroup_cpu_limit, physical_cores, usable_cpus
from packload.core.display import plural
from packload.core.memory import cgroup_memory_limit, read_meminfo
from packload.core.storage import MEMORY_FS, StorageFacts, storage_facts
from packload.diagnose.checks import GIB, Check, check, human_bytes
from packload.diagnose.gpu_checks import gpu_checks, settings_checks, settings_facts, torch_facts
from packload.diagnose.software import fast_hint, software_checks


@dataclass(frozen=True)
class SystemPaths:
    """Where the system files are; tests give fixture folders instead."""

    proc: str = "/proc"
    sys: str = "/sys"
    cgroup: str = "/sys/fs/cgroup"
    shm: str = "/dev/shm"

    @property
    def meminfo(self) -> str:
        return f"{self.proc}/meminfo"

    @property
    def cpuinfo(self) -> str:
        return f"{self.proc}/cpuinfo"

    @property
    def loadavg(self) -> str:
        return f"{self.proc}/loadavg"

    @property
    def mounts(self) -> str:
        return f"{self.proc}/mounts"

    @property
    def self_cgroup(self) -> str:
        return f"{self.proc}/self/cgroup"

    @property
    def nvidia_version(self) -> str:
        return f"{self.proc}/driver/nvidia/version"

def workers_range(usable: float) -> tuple[int, int]:
    """A sensible ``num_workers`` range: from half the usable CPUs to one per usable CPU."""
    top = max(1, math.floor(usable))
    return max(1, top // 2), top

def cpu_checks(logical: int, physical: int | None, affinity: int, quota: float | None) -> list[Check]:
    """What the CPU counts mean for DataLoader workers."""
    usable = usable_cpus(affinity, quota)
    low, high = workers_range(usable)
    parts = [plural(logical, "logical CPU"), plural(physical, "physical core") if physical else "physical cores unknown",
             f"{affinity} in this process's affinity mask"]
    parts.append(f"cgroup quota {plural(quota, 'CPU')}" if quota is not None else "no cgroup CPU quota")
    checks = [check("cpu", "info", f"{', '.join(parts)}: {usable:g} usable; num_workers {low}-{high} makes sense")]
    if usable < logical:
        checks.append(check("cpu_limit", "warn",
                            f"only {usable:g} of the {plural(logical, 'CPU')} are usable here (affinity or cgroup quota); "
                            "os.cpu_count() overstates what workers can use",
                            f"size num_workers from the usable CPUs ({low}-{high}), not os.cpu_count()"))
    if usable < 4:
        checks.append(check("cpu_few", "warn", f"{plural(usable, 'usable CPU')}: decoding and augmenting images on so few "
                            "cores rarely keeps a GPU busy",
                            "rent more CPU cores per GPU, decode at reduced size (decode_size), "
                            "or pack once at training resolution (--encoding raw --size)" + fast_hint()))
    return checks

def read_loadavg(path: str | os.PathLike[str] = "/proc/loadavg") -> list[float] | None:
    """The 1, 5 and 15 minute load averages, None when unreadable."""
    fields = (read_text(path) or "").split()
    try:
        return [float(x) for x in fields[:3]] if len(fields) >= 3 else None
    except ValueError:
        return None

def load_check(load: list[float] | None, usable: float) -> Check | None:
    """Other busy processes make every timing here slower and noisier: say so."""
    if load is None:
        return None
    if load[0] >= 1.0 and load[0] > 0.5 * usable:
        return check("load", "warn", f"load average {load[0]:.1f} on {usable:g} usable CPUs: other processes are "
                     "busy, so the loader timings below are pessimistic and noisy",
                     "run the doctor when the machine is otherwise idle")
    return check("load", "ok", f"load average {load[0]:.1f} on {usable:g} usable CPUs")

def shm_size(path: str | os.PathLike[str] = "/dev/shm") -> tuple[int, int] | None:
    """(total, free) bytes of the shared-memory filesystem, None when it is missing."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize

def shm_check(size: tuple[int, int] | None, minimum: int = GIB) -> Check:
    """DataLoader workers hand batches over in ``/dev/shm``; Docker's 64 MB default is too small."""
    fix = "start the container with --shm-size=8g (or --ipc=host); on Kubernetes mount an emptyDir " \
          "with medium: Memory at /dev/shm"
    if size is None:
        return check("shm", "warn", "/dev/shm is missing: DataLoader workers cannot share batches", fix)
    total, free = size
    if total < minimum:
        return check("shm", "warn", f"/dev/shm is {human_bytes(total)} ({human_bytes(free)} free): DataLoader "
                     "workers die with 'bus error' or 'No space left on device' once batches fill it", fix)
    return check("shm", "ok", f"/dev/shm is {human_bytes(total)} ({human_bytes(free)} free)")

def memory_checks(meminfo: dict[str, int], cgroup_limit: int | None, dataset_bytes: int | None) -> list[Check]:
    """RAM and cgroup limit, and whether the dataset fits in the page cache (read from disk once)."""
    total, available = meminfo.get("MemTotal"), meminfo.get("MemAvailable", meminfo.get("MemFree"))
    text = f"RAM {human_bytes(total)}, {human_bytes(available)} available"
    checks: list[Check] = []
    if cgroup_limit is not None and (total is None or cgroup_limit < total):
        text += f"; cgroup memory limit {human_bytes(cgroup_limit)} (the page cache counts against it)"
    checks.append(check("memory", "info", text))
    known = [v for v in (available, cgroup_limit) if v is not None]
    room = min(known) if known else None
    if dataset_bytes is not None and room is not None:
        if dataset_bytes <= 0.8 * room:
            checks.append(check("page_cache", "ok", f"the dataset ({human_bytes(dataset_bytes)}) fits in the page "
                                f"cache ({human_bytes(room)} free): after the first epoch it is read from memory"))
        else:
            checks.append(check("page_cache", "warn", f"the dataset ({human_bytes(dataset_bytes)}) does not fit in "
                                f"the page cache ({human_bytes(room)} free): every epoch reads it from storage",
                                "pack it (big sequential reads), put it on local NVMe, or shrink it once "
                                "(pack --max-side / --encoding jpeg)"))
    return checks

def storage_checks(facts: StorageFacts) -> list[Check]:
    """What the filesystem and disk mean for reading many files."""
    fstype, where = facts["fstype"] or "unknown", facts["mount_point"] or "?"
    base = f"{facts['path']} is on {fstype} (mounted at {where}, from {facts['source'] or '?'})"
    if facts["network"]:
        fs = check("filesystem", "warn", f"{base}: a network filesystem, each file open is a round trip",
                   "pack the dataset (a few large files read sequentially), or copy it to local disk first")
    elif facts["fuse"]:
        fs = check("filesystem", "warn", f"{base}: a FUSE filesystem, every read crosses into user space",
                   "pack the dataset, or copy it to a local disk before training")
    elif fstype in MEMORY_FS:
        fs = check("filesystem", "info", f"{base}: in memory, storage is no bottleneck (and the page cache "
                   "cannot be emptied to measure cold reads)")
    elif fstype == "overlay":
        fs = check("filesystem", "info", f"{base}: a container's overlay filesystem",
                   "mount datasets as a volume (docker -v) rather than keeping them in the image")
    else:
        fs = check("filesystem", "ok", base)
    return [fs, _disk_check(facts["disk"], facts["rotational"])]

def _disk_check(disk: str | None, spinning: bool | None) -> Check:
    if disk is None or spinning is None:
        return check("disk", "info", "disk type unknown (no block device behind this filesystem)")
    if not spinning:
        return check("disk", "ok", f"{disk}: solid-state (not rotational)")
    if re.match(r"(vd|xvd)[a-z]", disk):
        return check("disk", "info", f"{disk}: reported rotational, but it is a virtual disk; the flag often "
                     "says nothing about the storage behind it")
    return check("disk", "warn", f"{disk}: a spinning disk; random reads of small files run at ~100 files/s",
                 "pack the dataset (sequential reads) or move it to an SSD")

def small_files_check(files: int, total_bytes: int, many: int = 10_000, small: int = 200_000) -> Check:
    """Many small files are slow to open and read one by one: recommend packing them."""
    mean = total_bytes / files if files else 0
    text = f"{plural(files, 'file')}, {human_bytes(total_bytes)}, {human_bytes(mean)} on average"
    if files > many and mean < small:
        return check("small_files", "warn", f"{text}: many small files, one open() and one small read each",
                     "pack it: `pack SRC DEST.shards`, then load with loaders.PackedImageFolder")
    return check("small_files", "ok", text)

def collect_machine(dataset_path: str | None = None, dataset_bytes: int | None = None,
                    paths: SystemPaths | None = None) -> tuple[dict[str, Any], list[Check]]:
    """Read this machine (and the storage under ``dataset_path``); return the facts and the checks."""
    paths = paths or SystemPaths()
    tf = torch_facts(paths.nvidia_version)
    logical = os.cpu_count() or 1
    affinity = affinity_cpus()
    quota = cgroup_cpu_limit(paths.cgroup, paths.self_cgroup)
    physical = physical_cores(paths.cpuinfo)
    meminfo = read_meminfo(paths.meminfo)
    mem_limit = cgroup_memory_limit(paths.cgroup, paths.self_cgroup)
    shm = shm_size(paths.shm)
    settings = settings_facts()
    storage = storage_facts(dataset_path, paths.mounts, paths.sys) if dataset_path else None
    device = tf["devices"][0] if tf["devices"] else None
    capability = tuple(int(x) for x in device["capability"].split(".")) if device else None
    usable = usable_cpus(affinity, quota)
    load = read_loadavg(paths.loadavg)
    facts = {
        "torch": tf,
        "cpu": {"logical": logical, "physical": physical, "affinity": affinity, "cgroup_quota": quota,
                "usable": usable, "workers_range": list(workers_range(usable)), "load_average": load},
        "memory": {"total_bytes": meminfo.get("MemTotal"), "available_bytes": meminfo.get("MemAvailable"),
                   "cgroup_limit_bytes": mem_limit, "cgroup_version": cgroup_version(paths.cgroup)},
        "shm": {"path": paths.shm, "total_bytes": shm[0] if shm else None, "free_bytes": shm[1] if shm else None},
        "storage": storage,
        "settings": settings,
    }
    checks = gpu_checks(tf) + cpu_checks(logical, physical, affinity, quota)
    checks += [c for c in [load_check(load, usable)] if c is not None]
    checks += memory_checks(meminfo, mem_limit, dataset_bytes) + [shm_check(shm)] + software_checks()
    checks += storage_checks(storage) if storage else []
    checks += settings_checks(settings, (capability[0], capability[1]) if capability else None)
    return facts, checks
