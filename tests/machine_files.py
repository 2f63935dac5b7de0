"""System files for the machine and storage tests: ``/proc`` texts of a known machine, and writing them
into a fixture folder."""

from __future__ import annotations

from pathlib import Path

from packload.core.storage import storage_facts

GIB = 1 << 30

CPUINFO = "".join(f"processor\t: {i}\nphysical id\t: 0\ncore id\t\t: {i // 2}\ncpu cores\t: 2\n\n" for i in range(4))
MEMINFO = "MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    8000000 kB\nHugePages_Total:       0\n"

MOUNTS = """\
/dev/sda2 / ext4 rw,relatime 0 0
proc /proc proc rw 0 0
server:/export /mnt/data nfs4 rw,vers=4.1 0 0
/dev/nvme0n1p1 /mnt/data/local ext4 rw 0 0
/dev/sdb1 /mnt/dat xfs rw 0 0
gcsfuse /mnt/gcs fuse.gcsfuse rw 0 0
/dev/sdc1 /mnt/usb fuseblk rw 0 0
user@host:/x /mnt/my\\040files fuse.sshfs rw 0 0
overlay /var/lib/docker/overlay2/abc/merged overlay rw,lowerdir=/a 0 0
tmpfs /var/lib/docker/overlay2/abc/merged tmpfs rw 0 0
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def by_name(checks):
    """Checks by their name."""
    return {c["name"]: c for c in checks}


def in_memory(path):
    """Whether ``path`` is on a filesystem in memory (its pages cannot be evicted)."""
    return storage_facts(str(path))["fstype"] in ("tmpfs", "ramfs")
