"""Where a path lives: its mount, filesystem type (local, network, FUSE, memory) and the disk behind it.

Readers use these facts to choose how to read (parallel requests on network and FUSE storage);
``doctor`` turns them into advice. Each reader takes the system file's path as a parameter.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from packload.core.cgroups import read_text

NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "cephfs", "glusterfs", "lustre",
                        "gpfs", "beegfs", "afs", "9p", "orangefs", "pvfs2", "wekafs", "davfs"})

NETWORK_FUSE = frozenset({"gcsfuse", "s3fs", "rclone", "sshfs", "juicefs", "blobfuse", "blobfuse2", "goofys",
                          "mountpoint-s3", "alluxio-fuse", "ceph-fuse", "glusterfs", "lustre", "cephfs",
                          "davfs", "weka", "geesefs", "oss"})

MEMORY_FS = frozenset({"tmpfs", "ramfs"})


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
    for line in (read_text(path) or "").splitlines():
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
    text = read_text(Path(sys_root) / "block" / disk / "queue" / "rotational")
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

def reads_wait(path: str | os.PathLike[str]) -> bool:
    """Whether each read of ``path`` waits a round trip: on network and FUSE filesystems. Readers issue
    many reads at once there (the kernel's read-ahead does the job on a local disk)."""
    facts = storage_facts(str(path))
    return bool(facts["network"] or facts["fuse"])


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


VIRTUAL_FS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs",
                        "securityfs", "pstore", "bpf", "configfs", "efivarfs", "mqueue", "hugetlbfs", "fusectl",
                        "binfmt_misc", "autofs", "nsfs", "selinuxfs"})


def unwritable_reason(path: str | os.PathLike[str], mounts_file: str = "/proc/mounts") -> str | None:
    """Why nothing can be written under ``path`` (its nearest existing folder): on a virtual file
    system (``/proc``, ``/sys``) or mounted read-only; None when neither is known."""
    place = Path(os.path.abspath(path))
    while not place.exists() and place != place.parent:
        place = place.parent
    mount = find_mount(os.path.realpath(place), read_mounts(mounts_file))
    if mount is None:
        return None
    if mount.fstype in VIRTUAL_FS:
        return (f"{mount.point} is a virtual file system ({mount.fstype}) made by the kernel, which holds no "
                "files of yours")
    if "ro" in mount.options.split(","):
        return f"{mount.point} is mounted read-only"
    return None
