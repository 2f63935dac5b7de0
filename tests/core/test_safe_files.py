"""Opening and reading files that may not be what their names say (``packload.core.safe_files``):
regular files only (links followed), never blocking on a FIFO, never reading past the size seen
when opened, and a size limit checked before reading."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from packload.core.safe_files import (
    FileChangedError,
    FileTooLargeError,
    NotRegularFileError,
    kind_of,
    open_regular,
    read_open_file,
    read_regular,
)


def test_regular_files_are_read_whole_and_links_are_followed(tmp_path: Path) -> None:
    data = os.urandom(70_000)
    (tmp_path / "a.bin").write_bytes(data)
    (tmp_path / "link.jpg").symlink_to(tmp_path / "a.bin")
    assert read_regular(tmp_path / "a.bin") == data
    assert read_regular(tmp_path / "link.jpg") == data
    assert read_regular(tmp_path / "a.bin", limit=len(data)) == data
    folder = os.open(tmp_path, os.O_RDONLY)
    try:
        assert read_regular("a.bin", dir_fd=folder) == data
    finally:
        os.close(folder)
    (tmp_path / "empty.png").write_bytes(b"")
    assert read_regular(tmp_path / "empty.png") == b""


def test_what_is_not_a_regular_file_is_refused_by_name(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "y.jpg")  # an open() that blocked would hang the test here
    (tmp_path / "zero.jpg").symlink_to("/dev/zero")
    (tmp_path / "folder.png").mkdir()
    for name, kind in (("y.jpg", "a FIFO"), ("zero.jpg", "a character device"), ("folder.png", "a folder")):
        with pytest.raises(NotRegularFileError, match=kind) as caught:
            read_regular(tmp_path / name)
        assert caught.value.filename == str(tmp_path / name) and isinstance(caught.value, OSError)
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(NotRegularFileError):
        open_regular(tmp_path / "y.jpg")
    assert len(os.listdir("/proc/self/fd")) == before, "the refused file's descriptor is closed"


def test_a_file_over_the_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    (tmp_path / "big.json").write_bytes(b"x" * 1001)
    with pytest.raises(FileTooLargeError, match="1,001 bytes, more than the 1,000 allowed"):
        read_regular(tmp_path / "big.json", limit=1000)


def test_a_file_that_changes_size_while_read_is_noticed(tmp_path: Path) -> None:
    path = tmp_path / "growing.png"
    path.write_bytes(b"a" * 5000)
    fd, info = open_regular(path)
    try:
        assert read_open_file(fd, info.st_size, path, start=b"aaaa") == b"a" * 5000
        with open(path, "ab") as f:
            f.write(b"more")
        with pytest.raises(FileChangedError, match="5000 bytes, then 5001"):  # one byte past is enough
            read_open_file(fd, info.st_size, path)
        os.truncate(path, 10)
        with pytest.raises(FileChangedError, match="5000 bytes, then 10"):
            read_open_file(fd, info.st_size, path)
    finally:
        os.close(fd)


def test_kind_of_names_each_file_type() -> None:
    assert kind_of(stat.S_IFDIR) == "a folder" and kind_of(stat.S_IFIFO) == "a FIFO (named pipe)"
    assert kind_of(stat.S_IFSOCK) == "a socket" and kind_of(stat.S_IFCHR) == "a character device"
    assert kind_of(stat.S_IFBLK) == "a block device" and kind_of(stat.S_IFLNK) == "not a regular file"
