"""Open and read files that may not be what their names say.

A source folder is whatever the user points at, and a pack comes from elsewhere: a FIFO named
``y.jpg`` would block an ``open()`` forever, a link to ``/dev/zero`` named ``x.jpg`` would be read
until memory runs out. So files are opened without blocking, checked to be regular files (after
following links, as ImageFolder follows them), and never read past the size seen when opened.
"""

from __future__ import annotations

import errno
import os
import stat

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class NotRegularFileError(OSError):
    """The path is not a regular file (a FIFO, a device, a socket or a folder, possibly behind a link)."""


class FileChangedError(OSError):
    """A file's size changed while it was being read (it is being written by someone else)."""


class FileTooLargeError(OSError):
    """A file is larger than the reader allows (a metadata file that would take absurd memory)."""


def kind_of(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words, when it is not a regular file."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike[str], dir_fd: int | None = None) -> tuple[int, os.stat_result]:
    """A read-only descriptor of ``path`` and its ``fstat``; ``NotRegularFileError`` (after closing
    it) when it is not a regular file. Never blocks on a FIFO: it is opened non-blocking."""
    fd = os.open(path, _OPEN_FLAGS, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise NotRegularFileError(errno.EINVAL, f"{kind_of(info.st_mode)}, not a regular file", os.fspath(path))
    return fd, info


def read_open_file(fd: int, size: int, path: str | os.PathLike[str], start: bytes = b"") -> bytes:
    """The ``size`` bytes of the regular file open at ``fd`` (``start``: its first bytes, read
    already). ``FileChangedError`` when the file does not hold exactly ``size`` bytes any more."""
    parts = [start] if start else []
    have = len(start)
    while have <= size:  # one byte more than the size seen: a file that grew is noticed
        part = os.pread(fd, size + 1 - have, have)
        if not part:
            break
        parts.append(part)
        have += len(part)
    if have != size:
        raise FileChangedError(errno.EAGAIN, f"changed size while being read ({size} bytes, then {have})",
                               os.fspath(path))
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_regular(path: str | os.PathLike[str], limit: int | None = None, dir_fd: int | None = None) -> bytes:
    """The whole of the regular file at ``path``; ``NotRegularFileError`` for anything else,
    ``FileTooLargeError`` when it is larger than ``limit`` bytes (checked before reading)."""
    fd, info = open_regular(path, dir_fd=dir_fd)
    try:
        if limit is not None and info.st_size > limit:
            raise FileTooLargeError(errno.EFBIG, f"{info.st_size:,} bytes, more than the {limit:,} allowed",
                                    os.fspath(path))
        return read_open_file(fd, info.st_size, path)
    finally:
        os.close(fd)
