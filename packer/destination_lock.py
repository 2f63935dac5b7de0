"""One writer per destination: ``pack``, ``pack --engine ray`` and ``merge`` hold ``DEST.lock`` while
they write ``DEST``, and a second command is refused at once."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from types import TracebackType
from typing import Any

from packload.core.errors import UsageError, WriteError
from packload.core.storage import unwritable_reason
from packload.packer.destination import lock_path, system_reason

_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class DestinationLock:
    """An exclusive ``flock`` on ``DEST.lock`` (which holds the owner's pid, for the message), held
    while a command writes ``DEST``; a second command is refused at once, never kept waiting.

    The lock file is removed on release, while still locked. A command that opened the file just
    before that then locks an unlinked file, so after locking each command checks that the path
    still names the file it locked, and starts again if not."""

    def __init__(self, dst: Path) -> None:
        self.dst = dst
        self.path = lock_path(dst)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise ``UsageError`` naming the command that holds it."""
        while True:
            try:
                fd = os.open(self.path, _LOCK_FLAGS, 0o644)
            except OSError as exc:
                raise self._open_error(exc) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                owner = _read_pid(fd)
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise WriteError(f"{self.path}: cannot lock it ({system_reason(exc)}); choose a destination "
                                     "on a file system that supports file locks") from None
                raise UsageError(f"another packload command (pid {owner}) is writing {self.dst}; "
                                 "wait for it to finish") from None
            if self._still_named(fd):
                break
            os.close(fd)  # removed or replaced by its last owner meanwhile: lock the file there now
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def _open_error(self, exc: OSError) -> Exception:
        if exc.errno == errno.ELOOP:
            return UsageError(f"{self.path}: is a symbolic link, where packload keeps the lock of {self.dst}; "
                              "remove it")
        why = unwritable_reason(self.path.parent)
        if why:
            return WriteError(f"{self.dst}: cannot be written there: {why}; choose a destination on a disk "
                              "you can write to")
        return WriteError(f"{self.dst}: cannot create its lock file {self.path.name} ({system_reason(exc)}); "
                          "choose a destination in a folder you can write to")

    def _still_named(self, fd: int) -> bool:
        try:
            named = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)

    def release(self) -> None:
        """Remove the lock file, then let go of the lock."""
        if self._fd is None:
            return
        try:
            if self._still_named(self._fd):
                os.unlink(self.path)
        except OSError:
            pass  # a lock file left behind is harmless: the next command locks it
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DestinationLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _read_pid(fd: int) -> Any:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"
