"""A bounded local cache directory of byte blocks fetched from an object store.

Each block is one file, ``CACHE_DIR/<pack id>/<name>.<block number>``, written through a temporary
file and renamed, so a reader (in this process or another: DataLoader workers share the folder)
finds either a whole block or none. Before a block is written, the oldest files (least recently
used) are deleted until the new one fits: the files under the folder never take more than
``limit`` bytes together. Writers in several processes take turns under a lock file, so the
limit holds across them too; the lock file also records the bytes the files take, so a write that
fits needs no walk over the folder (a full cache holds thousands of blocks). A block larger than
the whole limit is not kept.

``fetching(pack, name)`` is a lock of one block across processes (and threads): the one that holds it fetches
the block, and another that wants the same block waits for it and then reads the cached file, so
DataLoader workers and the sampler's announcements never fetch one block twice.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from packload.core.errors import UsageError

DEFAULT_CACHE_LIMIT = 20 << 30  # bytes: a few epochs' worth of a mid-sized pack
LOCK_NAME = ".lock"
FETCHING_MARK = ".fetching"  # suffix of a block's lock file while a process fetches it
_TMP_MARK = ".tmp-"


def default_cache_dir() -> Path:
    """``$PACKLOAD_CACHE``, else ``$XDG_CACHE_HOME/packload``, else ``~/.cache/packload``."""
    if os.environ.get("PACKLOAD_CACHE"):
        return Path(os.environ["PACKLOAD_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "packload"


def default_cache_limit() -> int:
    """``$PACKLOAD_CACHE_LIMIT`` (bytes), else ``DEFAULT_CACHE_LIMIT``."""
    text = os.environ.get("PACKLOAD_CACHE_LIMIT", "").strip()
    if not text:
        return DEFAULT_CACHE_LIMIT
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"PACKLOAD_CACHE_LIMIT={text!r}: give a number of bytes, such as {DEFAULT_CACHE_LIMIT}") from None


class BlockCache:
    """Files of fetched bytes under ``folder``, never more than ``limit`` bytes in all."""

    def __init__(self, folder: str | os.PathLike[str] | None = None, limit: int | None = None) -> None:
        self.folder = Path(folder) if folder is not None else default_cache_dir()
        self.limit = default_cache_limit() if limit is None else int(limit)
        if self.limit < 0:
            raise ValueError(f"cache_limit {limit}: give a number of bytes, 0 or more")
        self._lock = threading.Lock()

    def path(self, pack: str, name: str) -> Path:
        return self.folder / pack / name

    def get(self, pack: str, name: str, size: int) -> Path | None:
        """The cached file of ``name`` when it is there whole (``size`` bytes), marked as used."""
        path = self.path(pack, name)
        try:
            if path.stat().st_size != size:
                return None
            os.utime(path)  # least recently used goes first
        except OSError:
            return None
        return path

    def put(self, pack: str, name: str, data: bytes | memoryview) -> Path | None:
        """Keep ``data`` as ``name``; returns its file, or None when it cannot be kept (larger than
        the limit, or the folder cannot be written: the bytes are then only in memory). The room is
        made, and the file's whole size taken, under the folder's lock; the bytes are written after."""
        if len(data) > self.limit:
            return None
        path = self.path(pack, name)
        try:
            tmp = self._claim(path, len(data))
            with open(tmp, "r+b") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError:
            return None
        return path

    def reserve(self, pack: str, name: str, size: int) -> Path:
        """Make room for a file of ``size`` bytes to be written as ``name`` (through a temporary file
        the caller renames); the temporary path. OSError when it cannot fit."""
        if size > self.limit:
            raise OSError(f"{size:,} bytes do not fit a cache limited to {self.limit:,}")
        return self._claim(self.path(pack, name), size)

    def _claim(self, path: Path, size: int) -> Path:
        """A temporary file of ``size`` bytes beside ``path``, made under the folder's lock once
        there is room for it (so other writers count it whole)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, self._folder_lock() as lock:
            self._make_room(lock, size)
            tmp = path.with_name(f"{path.name}{_TMP_MARK}{os.getpid()}-{threading.get_ident()}")
            with open(tmp, "wb") as f:
                f.truncate(size)  # holds its place
        return tmp

    def _make_room(self, lock: _FileLock, size: int) -> None:
        """Room for ``size`` more bytes. The folder's lock file records the bytes its files take, so
        a write that fits needs no look at the folder; one that does not (or a record missing or
        larger than the truth, after files were deleted by hand) walks it, deletes, and records anew."""
        recorded = lock.read_number()
        if recorded is not None and recorded + size <= self.limit:
            lock.write_number(recorded + size)
            return
        lock.write_number(self.make_room(size) + size)

    def fetching(self, pack: str, name: str) -> _FileLock:
        """A lock on block ``name`` held while it is fetched (``with cache.fetching(...)``): another
        process asking for it waits until it is done. The lock file is removed when released."""
        path = self.path(pack, name + FETCHING_MARK)
        path.parent.mkdir(parents=True, exist_ok=True)
        return _FileLock(path, remove=True)

    def make_room(self, size: int) -> int:
        """Delete the least recently used files until ``size`` more bytes fit under the limit
        (called with the folder's lock held); the bytes the files left take."""
        files = self.files()
        total = sum(length for _, _, length in files)
        for _, path, length in sorted(files):
            if total + size <= self.limit:
                break
            try:
                path.unlink()
            except OSError:
                continue
            total -= length
        return total

    def files(self) -> list[tuple[float, Path, int]]:
        """(last use, path, bytes) of every file under the folder, the lock file aside."""
        found = []
        for dirpath, _, names in os.walk(self.folder):
            for name in names:
                if name == LOCK_NAME or name.endswith(FETCHING_MARK):  # empty, and held by someone
                    continue
                path = Path(dirpath) / name
                try:
                    info = path.stat()
                except OSError:
                    continue
                found.append((info.st_mtime, path, info.st_size))  # a reserved file counts whole
        return found

    def used(self) -> int:
        """Bytes the folder's files take now."""
        return sum(length for _, _, length in self.files())

    def _folder_lock(self) -> _FileLock:
        return _FileLock(self.folder / LOCK_NAME)


class _FileLock:
    """An exclusive lock on a file (``flock``), held for a ``with`` block: other processes, and other
    threads of this one, wait for it.

    Not a POSIX record lock (``lockf``): those belong to a process, so the kernel's deadlock check
    sees two processes whose threads wait for each other's blocks (one thread of each fetching,
    another of each waiting for the other's block) as a deadlock and fails one of them with EDEADLK,
    although each fetch ends without the other. ``flock`` locks belong to the open file and are
    never checked so. The lock is released explicitly before the file is closed: a process forked
    while a thread holds it (a DataLoader worker started mid-fetch) has a copy of the descriptor,
    and closing ours alone would leave the lock held through that copy."""

    def __init__(self, path: Path, remove: bool = False) -> None:
        self.path = path
        self.remove = remove  # delete the file on release (one lock file per fetch, not kept)
        self.fd = -1

    def __enter__(self) -> _FileLock:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
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
        if self.remove:  # whoever waits holds the old file: it then finds the block cached
            try:
                os.unlink(self.path)
            except OSError:
                pass
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)  # released for every copy of the descriptor
        finally:
            os.close(self.fd)
            self.fd = -1
