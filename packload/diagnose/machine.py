"""Machine checks for ``packload doctor``: GPU and PyTorch build, CPUs, memory, ``/dev/shm``, storage.

Every reader of a system file takes the file's path (or the root it lies under) as a parameter, so
tests point it at fixture files; every judgement is a pure function of the facts read, returning
``Check`` lines (ok / warn / info, with the fix when something is wrong). ``collect_machine`` reads
the real machine and assembles both.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict

Status = Literal["ok", "warn", "info"]
STATUSES: tuple[str, ...] = ("ok", "warn", "info")

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
UNLIMITED_V1 = 1 << 62  # cgroup v1 writes "no limit" as a huge number (PAGE_COUNTER_MAX pages)
NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "cephfs", "glusterfs", "lustre",
                        "gpfs", "beegfs", "afs", "9p", "orangefs", "pvfs2", "wekafs", "davfs"})
NETWORK_FUSE = frozenset({"gcsfuse", "s3fs", "rclone", "sshfs", "juicefs", "blobfuse", "blobfuse2", "goofys",
                          "mountpoint-s3", "alluxio-fuse", "ceph-fuse", "glusterfs", "lustre", "cephfs",
                          "davfs", "weka", "geesefs", "oss"})
MEMORY_FS = frozenset({"tmpfs", "ramfs"})
# The PyTorch CUDA build (named as PyTorch's own wheel index names them) that has kernels for a
# compute-capability major version; PyTorch's install page lists the current ones.
WHEEL_FOR_MAJOR = {10: "cu128", 11: "cu128", 12: "cu128"}
DEFAULT_WHEEL = "cu126"
# Oldest driver each CUDA runtime major version runs on (minor-version compatibility).
MIN_DRIVER = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}


class Check(TypedDict):
    """One line of the diagnosis: what was checked, how it stands, and the fix when it is wrong."""

    name: str
    status: Status
    message: str
    fix: str | None


def check(name: str, status: Status, message: str, fix: str | None = None) -> Check:
    """A ``Check`` (the status must be one of ok, warn, info)."""
    if status not in STATUSES:
        raise ValueError(f"unknown status {status!r}")
    return {"name": name, "status": status, "message": message, "fix": fix}


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


def human_bytes(n: float | None) -> str:
    """``1.5 GiB``-style sizes (binary units, as RAM and ``--shm-size`` count)."""
    if n is None:
        return "unknown"
    for unit, size in (("TiB", 1 << 40), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _read_text(path: str | os.PathLike[str]) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


# -- memory --------------------------------------------------------------------------------------
def read_meminfo(path: str | os.PathLike[str] = "/proc/meminfo") -> dict[str, int]:
    """``/proc/meminfo`` as a dict, kB values converted to bytes ({} when unreadable)."""
    info: dict[str, int] = {}
    for line in (_read_text(path) or "").splitlines():
        match = re.match(r"(\S+):\s+(\d+)(?:\s+kB)?", line)
        if match:
            info[match.group(1)] = int(match.group(2)) * (KIB if line.rstrip().endswith("kB") else 1)
    return info


# -- cgroups -------------------------------------------------------------------------------------
def read_self_cgroup(path: str | os.PathLike[str] = "/proc/self/cgroup") -> dict[str, str]:
    """Controller → this process's cgroup path; the cgroup v2 entry is under the key ``""``."""
    groups: dict[str, str] = {}
    for line in (_read_text(path) or "").splitlines():
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


def _v1_controller_dir(root: Path, controller: str) -> Path | None:
    """The v1 hierarchy holding ``controller`` (``cpu`` may be mounted as ``cpu,cpuacct``)."""
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return None
    for entry in entries:
        if entry.is_dir() and controller in entry.name.split(","):
            return entry
    return None


def _cgroup_dirs(base: Path, rel: str) -> list[Path]:
    """``base/rel`` and each ancestor up to ``base``, those that exist: a limit set on any of them applies."""
    dirs = [base]
    current = base
    for part in [p for p in rel.split("/") if p]:
        current = current / part
        dirs.append(current)
    return [d for d in dirs if d.is_dir()]


def _parse_cpu_max(text: str) -> float | None:
    """cgroup v2 ``cpu.max`` (``"max 100000"`` or ``"200000 100000"``) → CPUs, None for no limit."""
    fields = text.split()
    if not fields or fields[0] == "max":
        return None
    period = int(fields[1]) if len(fields) > 1 else 100000
    return int(fields[0]) / period if period > 0 else None


def _min_limit(values: list[float | None]) -> float | None:
    limits = [v for v in values if v is not None]
    return min(limits) if limits else None


def cgroup_cpu_limit(cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
                     self_cgroup: str | os.PathLike[str] = "/proc/self/cgroup") -> float | None:
    """CPUs the cgroup quota allows (``cpu.max`` or ``cpu.cfs_quota_us / cpu.cfs_period_us``), None if none."""
    root, groups = Path(cgroup_root), read_self_cgroup(self_cgroup)
    if cgroup_version(root) == 2:
        return _min_limit([_parse_cpu_max(_read_text(d / "cpu.max") or "max")
                           for d in _cgroup_dirs(root, groups.get("", ""))])
    base = _v1_controller_dir(root, "cpu")
    if base is None:
        return None
    values: list[float | None] = []
    for d in _cgroup_dirs(base, groups.get("cpu", "")):
        quota, period = _read_text(d / "cpu.cfs_quota_us"), _read_text(d / "cpu.cfs_period_us")
        if quota and period and int(quota) > 0 and int(period) > 0:
            values.append(int(quota) / int(period))
    return _min_limit(values)


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
        values = [_parse_memory_limit(_read_text(d / "memory.max"), 1 << 63)
                  for d in _cgroup_dirs(root, groups.get("", ""))]
    else:
        base = _v1_controller_dir(root, "memory")
        dirs = _cgroup_dirs(base, groups.get("memory", "")) if base is not None else []
        values = [_parse_memory_limit(_read_text(d / "memory.limit_in_bytes"), UNLIMITED_V1) for d in dirs]
    limit = _min_limit([float(v) if v is not None else None for v in values])
    return int(limit) if limit is not None else None


def cgroup_memory_usage(cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
                        self_cgroup: str | os.PathLike[str] = "/proc/self/cgroup") -> int | None:
    """Bytes this process's cgroup uses now (``memory.current`` or ``memory.usage_in_bytes``)."""
    root, groups = Path(cgroup_root), read_self_cgroup(self_cgroup)
    if cgroup_version(root) == 2:
        dirs, name = _cgroup_dirs(root, groups.get("", "")), "memory.current"
    else:
        base = _v1_controller_dir(root, "memory")
        dirs = _cgroup_dirs(base, groups.get("memory", "")) if base is not None else []
        name = "memory.usage_in_bytes"
    text = (_read_text(dirs[-1] / name) or "").strip() if dirs else ""
    return int(text) if text.isdigit() else None


# -- CPUs ----------------------------------------------------------------------------------------
def physical_cores(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> int | None:
    """Distinct (package, core) pairs in ``/proc/cpuinfo``; None when it does not say."""
    cores: set[tuple[str, str]] = set()
    for block in (_read_text(cpuinfo) or "").split("\n\n"):
        fields = dict(re.findall(r"^([^\t:\n]+?)\s*:\s*(.*)$", block, re.MULTILINE))
        if "core id" in fields:
            cores.add((fields.get("physical id", "0"), fields["core id"]))
    return len(cores) or None


def usable_cpus(affinity: int, quota: float | None) -> float:
    """CPUs this process can really keep busy: its affinity mask, capped by the cgroup quota."""
    return min(float(affinity), quota) if quota is not None else float(affinity)


def workers_range(usable: float) -> tuple[int, int]:
    """A sensible ``num_workers`` range: from half the usable CPUs to one per usable CPU."""
    top = max(1, math.floor(usable))
    return max(1, top // 2), top


def cpu_checks(logical: int, physical: int | None, affinity: int, quota: float | None) -> list[Check]:
    """What the CPU counts mean for DataLoader workers."""
    usable = usable_cpus(affinity, quota)
    low, high = workers_range(usable)
    parts = [f"{logical} logical CPUs", f"{physical} physical cores" if physical else "physical cores unknown",
             f"{affinity} in this process's affinity mask"]
    parts.append(f"cgroup quota {quota:g} CPUs" if quota is not None else "no cgroup CPU quota")
    checks = [check("cpu", "info", f"{', '.join(parts)}: {usable:g} usable; num_workers {low}-{high} makes sense")]
    if usable < logical:
        checks.append(check("cpu_limit", "warn",
                            f"only {usable:g} of the {logical} CPUs are usable here (affinity or cgroup quota); "
                            "os.cpu_count() overstates what workers can use",
                            f"size num_workers from the usable CPUs ({low}-{high}), not os.cpu_count()"))
    if usable < 4:
        checks.append(check("cpu_few", "warn", f"{usable:g} usable CPUs: decoding and augmenting images on so few "
                            "cores rarely keeps a GPU busy",
                            "rent more CPU cores per GPU, decode at reduced size (decode_size), install "
                            "packload[fast], or pack once at training resolution (--encoding raw --size)"))
    return checks


def read_loadavg(path: str | os.PathLike[str] = "/proc/loadavg") -> list[float] | None:
    """The 1, 5 and 15 minute load averages, None when unreadable."""
    fields = (_read_text(path) or "").split()
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


# -- /dev/shm ------------------------------------------------------------------------------------
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


# -- storage -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mount:
    """One line of ``/proc/mounts``."""

    source: str
    point: str
    fstype: str
    options: str


def _unescape(field: str) -> str:
    """``/proc/mounts`` writes space, tab, newline and backslash as octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def read_mounts(path: str | os.PathLike[str] = "/proc/mounts") -> list[Mount]:
    """Every mount, in mount order."""
    mounts = []
    for line in (_read_text(path) or "").splitlines():
        fields = line.split()
        if len(fields) >= 4:
            mounts.append(Mount(_unescape(fields[0]), _unescape(fields[1]), fields[2], fields[3]))
    return mounts


def find_mount(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount holding ``path`` (an absolute, resolved path): the longest mount point that is a
    prefix of it at a ``/`` boundary; of equal ones the last mounted (it hides the others)."""
    best: Mount | None = None
    for mount in mounts:
        point = mount.point.rstrip("/") or "/"
        if path == point or path.startswith(point if point == "/" else point + "/"):
            if best is None or len(point) >= len(best.point.rstrip("/") or "/"):
                best = mount
    return best


def is_fuse(fstype: str) -> bool:
    """FUSE filesystems (``fuse``, ``fuseblk``, ``fuse.sshfs``...): every read crosses into user space."""
    return fstype.startswith("fuse")


def is_network_fs(fstype: str) -> bool:
    """Filesystems whose reads go over the network (NFS, SMB, Ceph, Lustre, gcsfuse, s3fs...)."""
    return fstype in NETWORK_FS or (fstype.startswith("fuse.") and fstype[5:] in NETWORK_FUSE)


def whole_disk(name: str, sys_root: str | os.PathLike[str] = "/sys") -> str | None:
    """The disk a block device belongs to (``sda2`` → ``sda``, ``nvme0n1p1`` → ``nvme0n1``), or None."""
    sys = Path(sys_root)
    entry = sys / "class" / "block" / name
    if (entry / "partition").is_file():
        return entry.resolve().parent.name
    if (sys / "block" / name).is_dir():
        return name
    match = re.fullmatch(r"(.*\d)p\d+|(\D+)\d+", name)  # nvme0n1p1, mmcblk0p2 | sda2, vdb1
    parent = match and (match.group(1) or match.group(2))
    return parent if parent and (sys / "block" / parent).is_dir() else None


def disk_of(source: str, sys_root: str | os.PathLike[str] = "/sys", dev: int | None = None) -> str | None:
    """The disk behind a mount: by the device number (``st_dev``) when sysfs knows it, else by the
    mount's source (``/dev/sda2``, ``/dev/mapper/x`` → ``dm-0``)."""
    if dev is not None:
        link = Path(sys_root) / "dev" / "block" / f"{os.major(dev)}:{os.minor(dev)}"
        if link.exists():
            return whole_disk(link.resolve().name, sys_root)
    if not source.startswith("/dev/"):
        return None
    real = os.path.realpath(source) if os.path.exists(source) else source
    return whole_disk(os.path.basename(real), sys_root)


def rotational(disk: str, sys_root: str | os.PathLike[str] = "/sys") -> bool | None:
    """True for a spinning disk, False for an SSD, None when the kernel does not say."""
    text = _read_text(Path(sys_root) / "block" / disk / "queue" / "rotational")
    return None if text is None or text.strip() not in ("0", "1") else text.strip() == "1"


class StorageFacts(TypedDict):
    """Where a dataset lives."""

    path: str
    mount_point: str | None
    fstype: str | None
    source: str | None
    network: bool
    fuse: bool
    disk: str | None
    rotational: bool | None


def storage_facts(path: str, mounts_file: str = "/proc/mounts", sys_root: str = "/sys") -> StorageFacts:
    """The filesystem and disk under ``path``."""
    real = os.path.realpath(path)
    mount = find_mount(real, read_mounts(mounts_file))
    try:
        dev: int | None = os.stat(real).st_dev
    except OSError:
        dev = None
    fstype = mount.fstype if mount else None
    disk = disk_of(mount.source, sys_root, dev) if mount else None
    return {"path": real, "mount_point": mount.point if mount else None, "fstype": fstype,
            "source": mount.source if mount else None, "network": bool(fstype and is_network_fs(fstype)),
            "fuse": bool(fstype and is_fuse(fstype)), "disk": disk,
            "rotational": rotational(disk, sys_root) if disk else None}


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
    text = f"{files:,} files, {human_bytes(total_bytes)}, {human_bytes(mean)} on average"
    if files > many and mean < small:
        return check("small_files", "warn", f"{text}: many small files, one open() and one small read each",
                     "pack it: `pack SRC DEST.shards`, then load with loaders.PackedImageFolder")
    return check("small_files", "ok", text)


# -- PyTorch and the GPU -------------------------------------------------------------------------
def parse_arch(arch: str) -> tuple[str, int, str] | None:
    """``sm_90`` → ("sm", 90, ""), ``sm_90a`` → ("sm", 90, "a"), ``compute_80`` → ("compute", 80, "")."""
    match = re.fullmatch(r"(sm|compute)_(\d+)([a-z]*)", arch)
    return (match.group(1), int(match.group(2)), match.group(3)) if match else None


def _split(number: int) -> tuple[int, int]:
    """``90`` → (9, 0), ``120`` → (12, 0): the last digit is the minor version."""
    major, minor = divmod(number, 10)
    return major, minor


def arch_support(capability: tuple[int, int], arch_list: list[str]) -> str | None:
    """How this build runs on a GPU of ``capability``: ``native`` (a cubin it can run: same major,
    minor not above the GPU's), ``ptx`` (only by JIT-compiling PTX of an older arch), ``none`` (the
    cause of "no kernel image is available"), or None when the build lists nothing (CPU build)."""
    major, minor = capability
    parsed = [p for p in (parse_arch(a) for a in arch_list) if p]
    if not parsed:
        return None
    for kind, number, suffix in parsed:
        arch_major, arch_minor = _split(number)
        if kind == "sm" and arch_major == major and (arch_minor == minor if suffix else arch_minor <= minor):
            return "native"
    if any(kind == "compute" and _split(number) <= (major, minor) for kind, number, _ in parsed):
        return "ptx"
    return "none"


def install_hint(capability: tuple[int, int]) -> str:
    """What to install for a GPU of this capability."""
    sm = f"sm_{capability[0]}{capability[1]}"
    if capability < (5, 0):
        return (f"current PyTorch builds no longer ship kernels for {sm}; use an older PyTorch release whose "
                "torch.cuda.get_arch_list() lists it, or a newer GPU")
    wheel = WHEEL_FOR_MAJOR.get(capability[0], DEFAULT_WHEEL)
    return (f"install a PyTorch build with {sm} kernels: the {wheel} wheel from PyTorch's own wheel index "
            "(see PyTorch's install page), then check torch.cuda.get_arch_list()")


def parse_driver_version(text: str | None) -> str | None:
    """The version in ``/proc/driver/nvidia/version`` ("... Kernel Module  550.54.15 ...")."""
    match = re.search(r"Kernel Module(?: for [\w-]+)?\s+(\d+\.\d+(?:\.\d+)?)", text or "")
    return match.group(1) if match else None


def driver_version(version_file: str = "/proc/driver/nvidia/version") -> str | None:
    """The NVIDIA driver version from the kernel module, else from nvidia-smi; None without a driver."""
    found = parse_driver_version(_read_text(version_file))
    if found or not shutil.which("nvidia-smi"):
        return found
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


class GpuFacts(TypedDict):
    """One visible GPU."""

    index: int
    name: str
    capability: str
    sm: str
    memory_bytes: int


class TorchFacts(TypedDict):
    """The PyTorch build and what it sees."""

    version: str
    cuda_build: str | None
    hip_build: str | None
    cuda_available: bool
    driver_version: str | None
    cudnn_version: int | None
    arch_list: list[str]
    devices: list[GpuFacts]
    kernels: str | None


def torch_facts(version_file: str = "/proc/driver/nvidia/version") -> TorchFacts:
    """Read the PyTorch build, its CUDA runtime and the GPUs it sees (without changing anything)."""
    import torch

    available = bool(torch.cuda.is_available())
    devices: list[GpuFacts] = []
    for i in range(torch.cuda.device_count() if available else 0):
        props = torch.cuda.get_device_properties(i)
        devices.append({"index": i, "name": props.name, "capability": f"{props.major}.{props.minor}",
                        "sm": f"sm_{props.major}{props.minor}", "memory_bytes": int(props.total_memory)})
    arch_list = list(torch.cuda.get_arch_list()) if available else []
    kernels = None
    if devices and torch.version.hip is None:
        major, minor = (int(x) for x in devices[0]["capability"].split("."))
        kernels = arch_support((major, minor), arch_list)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"version": torch.__version__, "cuda_build": torch.version.cuda, "hip_build": torch.version.hip,
            "cuda_available": available, "driver_version": driver_version(version_file),
            "cudnn_version": cudnn, "arch_list": arch_list, "devices": devices, "kernels": kernels}


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def gpu_checks(facts: TorchFacts) -> list[Check]:
    """The PyTorch build against the GPU and driver actually here."""
    build = f"PyTorch {facts['version']}" + (f" (CUDA {facts['cuda_build']})" if facts["cuda_build"] else
                                             f" (ROCm {facts['hip_build']})" if facts["hip_build"] else
                                             " (CPU-only build)")
    if not facts["cuda_available"]:
        return [_no_gpu_check(facts, build)]
    checks = [check("gpu", "ok", f"{build}; " + "; ".join(
        f"GPU {d['index']}: {d['name']}, compute capability {d['capability']} ({d['sm']}), "
        f"{human_bytes(d['memory_bytes'])}" for d in facts["devices"]) + f"; driver {facts['driver_version'] or '?'}")]
    checks += _kernel_checks(facts)
    checks += _driver_checks(facts)
    return checks


def _no_gpu_check(facts: TorchFacts, build: str) -> Check:
    driver = facts["driver_version"]
    if not driver:
        return check("gpu", "info", f"{build}, no GPU here (no NVIDIA driver found): the training step is "
                     "emulated (a wait of the step time) and GPU-specific checks are skipped",
                     None if not facts["cuda_build"] else
                     "if this machine has a GPU: in a container, start it with --gpus all")
    if not facts["cuda_build"] and not facts["hip_build"]:
        return check("gpu", "warn", f"{build}, but an NVIDIA driver ({driver}) is installed: this PyTorch "
                     "cannot use the GPU", f"install a CUDA build of PyTorch (for example the {DEFAULT_WHEEL} "
                     "wheel from PyTorch's own wheel index; see PyTorch's install page)")
    return check("gpu", "warn", f"{build} and NVIDIA driver {driver}, but no GPU is available to PyTorch",
                 "check nvidia-smi; make sure CUDA_VISIBLE_DEVICES is not empty; in a container start it with "
                 "--gpus all; the driver must be new enough for this CUDA runtime")


def _kernel_checks(facts: TorchFacts) -> list[Check]:
    if facts["hip_build"] or not facts["devices"]:
        return []
    device = facts["devices"][0]
    capability = tuple(int(x) for x in device["capability"].split("."))
    archs = " ".join(facts["arch_list"]) or "none"
    if facts["kernels"] == "native":
        return [check("gpu_kernels", "ok", f"this build has kernels for {device['sm']} (built for: {archs})")]
    if facts["kernels"] == "ptx":
        return [check("gpu_kernels", "warn", f"no {device['sm']} kernels in this build (built for: {archs}); "
                      "they are JIT-compiled from PTX: slow first start, possibly slower kernels",
                      install_hint((capability[0], capability[1])))]
    return [check("gpu_kernels", "warn", f"this build has no kernels for {device['sm']} (built for: {archs}): "
                  "CUDA calls fail with 'no kernel image is available for execution on the device'",
                  install_hint((capability[0], capability[1])))]


def _driver_checks(facts: TorchFacts) -> list[Check]:
    driver, runtime = facts["driver_version"], facts["cuda_build"]
    if not driver or not runtime:
        return []
    needed = MIN_DRIVER.get(_version_tuple(runtime)[0])
    if needed and _version_tuple(driver) < needed:
        return [check("driver", "warn", f"driver {driver} is older than CUDA {runtime} needs "
                      f"({'.'.join(map(str, needed))} or newer)",
                      "update the NVIDIA driver, or install a PyTorch build for an older CUDA")]
    return [check("driver", "ok", f"driver {driver} runs CUDA {runtime}")]


def settings_facts() -> dict[str, Any]:
    """Training settings that change speed a lot (read, never changed)."""
    import torch

    return {"cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32)}


def settings_checks(settings: dict[str, Any], capability: tuple[int, int] | None) -> list[Check]:
    """Recommendations for cudnn.benchmark, TF32 and mixed precision (nothing is changed)."""
    on_gpu = "" if capability else " (applies on a GPU; none here)"
    checks = [check("cudnn_benchmark", "ok" if settings["cudnn_benchmark"] else "info",
                    f"torch.backends.cudnn.benchmark = {settings['cudnn_benchmark']}{on_gpu}",
                    None if settings["cudnn_benchmark"] else
                    "set torch.backends.cudnn.benchmark = True when input sizes are fixed")]
    precision = settings["float32_matmul_precision"]
    if capability is None or capability >= (8, 0):
        tf32 = precision != "highest"
        checks.append(check("tf32", "ok" if tf32 else "info", f"float32 matmul precision {precision!r}"
                            + ("" if tf32 else ": TF32 tensor cores unused for float32 matmuls") + on_gpu,
                            None if tf32 else "torch.set_float32_matmul_precision('high') (Ampere or newer)"))
    if capability is None or capability >= (8, 0):
        amp = "torch.autocast('cuda', dtype=torch.bfloat16) around the forward pass"
    elif capability >= (7, 0):
        amp = "torch.autocast('cuda', dtype=torch.float16) with torch.amp.GradScaler"
    else:
        amp = "none: this GPU has no tensor cores"
    checks.append(check("mixed_precision", "info", f"mixed precision: recommended {amp}{on_gpu}"))
    return checks


# -- everything ----------------------------------------------------------------------------------
def collect_machine(dataset_path: str | None = None, dataset_bytes: int | None = None,
                    paths: SystemPaths | None = None) -> tuple[dict[str, Any], list[Check]]:
    """Read this machine (and the storage under ``dataset_path``); return the facts and the checks."""
    paths = paths or SystemPaths()
    tf = torch_facts(paths.nvidia_version)
    logical = os.cpu_count() or 1
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else logical
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
    checks += memory_checks(meminfo, mem_limit, dataset_bytes) + [shm_check(shm)]
    checks += storage_checks(storage) if storage else []
    checks += settings_checks(settings, (capability[0], capability[1]) if capability else None)
    return facts, checks
