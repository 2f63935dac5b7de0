"""An exclusive lock on a file (``flock``), held for a ``with`` block: how the block cache's writers
and fetchers in several processes (and threads) take turns."""

from __future__ import annotations

import fcntl
import os

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class FileLock:
    """An exclusive lock on a file (``flock``) named ``name`` in the folder ``folder`` (a
    descriptor; the file is opened without following a link), held for a ``with`` block: other
    processes, and other threads of this one, wait for it.

    Not a POSIX record lock (``lockf``): those belong to a process, so the kernel's deadlock check
    sees two processes whose threads wait for each other's blocks (one thread of each fetching,
    another of each waiting for the other's block) as a deadlock and fails one of them with EDEADLK,
    although each fetch ends without the other. ``flock`` locks belong to the open file and are
    never checked so. The lock is released explicitly before the file is closed: a process forked
    while a thread holds it (a DataLoader worker started mid-fetch) has a copy of the descriptor,
    and closing ours alone would leave the lock held through that copy."""

    def __init__(self, folder: int, name: str, remove: bool = False) -> None:
        self.folder = folder
        self.name = name
        self.remove = remove  # delete the file on release (one lock file per fetch, not kept)
        self.fd = -1

    def __enter__(self) -> FileLock:
        self.fd = os.open(self.name, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o644, dir_fd=self.folder)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError:
            os.close(self.fd)
            raise
        return self

    def read_number(self) -> int | None:
        """The number written in the held lock file (None: none, or not one)."""
        text = os.pread(self.fd, 32, 0)
        return int(text) if text.strip().isdigit() else None

    def write_number(self, number: int) -> None:
        """Write ``number`` into the held lock file, in place of what it held."""
        data = str(number).encode()
        os.pwrite(self.fd, data, 0)
        os.ftruncate(self.fd, len(data))

    def __exit__(self, *exc: object) -> None:
        if self.remove:  # whoever waits holds the old file: it then finds the entry cached
            try:
                os.unlink(self.name, dir_fd=self.folder)
            except OSError:
                pass
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)  # released for every copy of the descriptor
        finally:
            os.close(self.fd)
            self.fd = -1
