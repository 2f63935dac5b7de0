"""What the folder scan does not read: entries that are no regular file (a FIFO, a socket, a device,
possibly behind a link), and folders on the system's special file systems (``/proc``, ``/sys``,
``/dev``), which a link could lead a walk into. Both are left out with a reason that says so."""

from __future__ import annotations

import os
import stat
from functools import lru_cache

from packload.core.safe_files import kind_of

NOT_REGULAR = "not a regular file"  # in the reason of every entry left out for being no regular file

# File systems of the system itself, not of data: walking into one through a link would read
# kernel tables (``/proc/<pid>/root`` leads back to ``/``) or meet devices.
_SPECIAL_FS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "debugfs", "tracefs", "securityfs", "cgroup",
                         "cgroup2", "configfs", "pstore", "bpf", "fusectl", "mqueue", "efivarfs", "binfmt_misc",
                         "selinuxfs", "hugetlbfs", "rpc_pipefs", "nsfs", "devfs"})
_SPECIAL_DIRS = ("/proc", "/sys", "/dev")  # where they are mounted (``/dev`` is a tmpfs in containers)


@lru_cache(maxsize=1)
def special_devices() -> dict[int, str]:
    """Device numbers (``st_dev``) of the special file systems mounted here, with their type: those
    listed in ``/proc/self/mountinfo``, and ``/proc``, ``/sys`` and ``/dev`` where they are mount points."""
    found: dict[int, str] = {}
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            table = f.read(1 << 24).decode("utf-8", "replace")  # a few KB; bounded all the same
    except OSError:
        table = ""
    for line in table.splitlines():
        fields, _, rest = line.partition(" - ")
        words, kind = fields.split(), rest.split(" ", 1)[0]
        if kind in _SPECIAL_FS and len(words) > 2 and words[2].count(":") == 1:
            major, minor = words[2].split(":")
            if major.isdigit() and minor.isdigit():
                found[os.makedev(int(major), int(minor))] = kind
    try:
        top = os.stat("/").st_dev
    except OSError:
        return found
    for path in _SPECIAL_DIRS:
        try:
            dev = os.stat(path).st_dev
        except OSError:
            continue
        if dev != top:
            found.setdefault(dev, path.strip("/"))
    return found


def special_reason(st_dev: int) -> str | None:
    """Why a folder on device ``st_dev`` is not walked, when it is on a special file system."""
    kind = special_devices().get(st_dev)
    if kind is None:
        return None
    return f"a folder on the system's {kind} file system (kernel files and devices, not images): not scanned"


def not_regular_reason(entry: os.DirEntry[str]) -> str | None:
    """Why ``entry`` (not a folder, not a regular file by its listing type) is left out: a FIFO, a
    socket, a device, possibly behind a link. None when it may be read after all: a broken link or
    one that cannot be followed is kept, so that reading it names the problem as for any broken file."""
    try:
        mode = entry.stat().st_mode  # follows links, as ImageFolder does
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    through = " (through a symbolic link)" if entry.is_symlink() else ""
    return f"{kind_of(mode)}{through}, {NOT_REGULAR}"
