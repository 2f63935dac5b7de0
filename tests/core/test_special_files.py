"""What the folder scan does not read (``packload.core.special_files``): real FIFOs, sockets, devices
and links in a folder the test makes, each left out with the reason that says what it is (a broken
link or a loop kept, for its read to name the problem); and the special file systems (``/proc``,
``/sys``, ``/dev``), from this machine's mount table and from mount tables the test writes."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from packload.core import special_files
from packload.core.special_files import NOT_REGULAR, not_regular_reason, special_devices, special_reason


def entries(folder: Path) -> dict[str, os.DirEntry[str]]:
    with os.scandir(folder) as listing:
        return {entry.name: entry for entry in listing}


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    """A folder of one of each: a file, a FIFO, a socket, links to each and to a device, a broken
    link and a loop of links."""
    (tmp_path / "a.jpg").write_bytes(b"\xff\xd8\xff")
    os.mkfifo(tmp_path / "pipe.jpg")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "sock.jpg"))
    for name, target in (("to_file.jpg", "a.jpg"), ("to_pipe.jpg", "pipe.jpg"), ("to_sock.jpg", "sock.jpg"),
                         ("to_null.jpg", os.devnull), ("broken.jpg", "missing.jpg"), ("loop1.jpg", "loop2.jpg"),
                         ("loop2.jpg", "loop1.jpg")):
        (tmp_path / name).symlink_to(target)
    yield tmp_path
    server.close()


def test_each_entry_left_out_says_what_it_is(folder: Path) -> None:
    reasons = {name: not_regular_reason(entry) for name, entry in entries(folder).items()}
    assert reasons == {
        "a.jpg": None,
        "to_file.jpg": None,  # a link to a regular file is read, as ImageFolder reads it
        "pipe.jpg": f"a FIFO (named pipe), {NOT_REGULAR}",
        "sock.jpg": f"a socket, {NOT_REGULAR}",
        "to_pipe.jpg": f"a FIFO (named pipe) (through a symbolic link), {NOT_REGULAR}",
        "to_sock.jpg": f"a socket (through a symbolic link), {NOT_REGULAR}",
        "to_null.jpg": f"a character device (through a symbolic link), {NOT_REGULAR}",
        # cannot be followed: kept, so that reading it names the problem as for any broken file
        "broken.jpg": None,
        "loop1.jpg": None,
        "loop2.jpg": None,
    }


def test_an_entry_that_vanished_since_its_listing_is_kept(folder: Path) -> None:
    listed = entries(folder)
    (folder / "pipe.jpg").unlink()  # gone between the listing and the look
    assert not_regular_reason(listed["pipe.jpg"]) is None


def test_the_system_folders_are_special() -> None:
    root = os.stat("/").st_dev
    proc = os.stat("/proc").st_dev
    if proc == root:
        pytest.skip("/proc is not mounted here")
    assert special_devices()[proc] == "proc"
    assert special_reason(proc) == ("a folder on the system's proc file system (kernel files and devices, not "
                                    "images): not scanned")


def test_a_data_folder_is_not_special(tmp_path: Path) -> None:
    assert special_reason(tmp_path.stat().st_dev) is None
    assert special_reason(os.stat("/").st_dev) is None


# -- mount tables the test writes ---------------------------------------------------------------------
@pytest.fixture
def mount_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A file that ``special_devices`` reads in place of ``/proc/self/mountinfo`` (its cache
    emptied before and after, so that no other test sees this table)."""
    table = tmp_path / "mountinfo"
    real_open = open

    def open_the_table(path: str, *args: object, **kwargs: object) -> object:
        return real_open(table if path == "/proc/self/mountinfo" else path, *args, **kwargs)

    monkeypatch.setattr(special_files, "open", open_the_table, raising=False)
    special_devices.cache_clear()
    yield table
    special_devices.cache_clear()


def test_the_special_kinds_of_a_mount_table(mount_table: Path) -> None:
    mount_table.write_text(
        "22 27 123:21 / /proc rw,relatime - proc proc rw\n"
        "23 27 123:22 / /sys rw,relatime shared:7 master:1 - sysfs sysfs rw\n"  # optional fields before ' - '
        "30 23 123:30 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"  # a data file system: not special
        "31 23 123:31 / /mnt/fuse rw - fuse.sshfs host:/x rw\n"
        "40 1 123:x / /odd rw - proc proc rw\n"  # a device number it cannot read: left out
        "41 1 1:2:3 / /odd2 rw - proc proc rw\n"
        "a line that is no mount at all\n")
    found = special_devices()
    assert found[os.makedev(123, 21)] == "proc" and found[os.makedev(123, 22)] == "sysfs"
    assert found[os.makedev(123, 30)] == "cgroup2"
    assert os.makedev(254, 0) not in found and os.makedev(123, 31) not in found
    assert special_reason(os.makedev(123, 30)) == ("a folder on the system's cgroup2 file system (kernel files and "
                                                   "devices, not images): not scanned")


def test_without_a_mount_table_the_system_folders_still_count(mount_table: Path) -> None:
    """``/proc/self/mountinfo`` unreadable: ``/proc``, ``/sys`` and ``/dev`` are special by where
    they are mounted, each named by its folder."""
    assert not mount_table.exists()
    root = os.stat("/").st_dev
    mounted = {os.stat(path).st_dev: path.strip("/") for path in ("/proc", "/sys", "/dev")
               if os.path.exists(path) and os.stat(path).st_dev != root}
    if not mounted:
        pytest.skip("none of /proc, /sys and /dev is a mount point here")
    assert special_devices() == mounted
