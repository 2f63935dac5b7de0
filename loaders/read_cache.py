"""A bounded local cache of byte blocks fetched from an object store, that owns only what it wrote.

``BlockCache`` keeps each entry (a block of a shard, a pack's index, a whole LMDB file) in
packload's own folder inside the cache folder given (``loaders.cache_folder``), as its bytes and a
record of what they are (``loaders.cache_entries``): an entry is read only when it is the bytes its
record names.

**Limit.** The entries never take more than ``limit`` bytes together: before an entry is written,
the least recently used ones are deleted until it fits (``loaders.cache_walk``). Writers in several
processes take turns under a lock file, which also records the bytes the entries take, so a write
that fits needs no walk over the folder. An entry larger than the whole limit is not kept.

``fetching(pack, identity)`` is a lock of one entry across processes (and threads): the one that
holds it fetches the bytes, and another that wants the same entry waits for it and then reads the
cached file, so DataLoader workers and the sampler's announcements never fetch one block twice.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import shutil
import stat
import threading
import zlib
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from packload.core.errors import UsageError
from packload.loaders.cache_entries import (
    DATA_SUFFIX,
    RECORD_ALLOWANCE,
    RECORD_SUFFIX,
    Reservation,
    entry_name,
    matches_record,
    signature,
    temporary_name,
)
from packload.loaders.cache_folder import (
    CACHE_SUBFOLDER,
    CLOEXEC,
    MARKER_NAME,
    NOFOLLOW,
    NONBLOCK,
    CacheFolder,
    CacheUnusableError,
    default_cache_dir,
    pack_folder_name,
)
from packload.loaders.cache_walk import Entry, delete_oldest, recorded_entries, writing_bytes
from packload.loaders.file_lock import FileLock

# What readers (and tests) import from here; the entries' format and the folder are defined beside.
__all__ = ["CACHE_SUBFOLDER", "DATA_SUFFIX", "DEFAULT_CACHE_LIMIT", "FETCHING_MARK", "LOCK_NAME", "MARKER_NAME",
           "RECORD_SUFFIX", "BlockCache", "CacheUnusableError", "Reservation", "default_cache_dir",
           "default_cache_limit", "entry_name", "pack_folder_name"]

DEFAULT_CACHE_LIMIT = 20 << 30  # bytes: a few epochs' worth of a mid-sized pack
LOCK_NAME = ".lock"  # the writers' lock file, which records the bytes the entries take
FETCHING_MARK = ".fetching"  # suffix of an entry's lock file while a process fetches it


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
    """Entries of fetched bytes in ``folder/packload-blocks``, never more than ``limit`` bytes in all.

    A reader opens one per pack it opens (its memory of the entries it checked is per open);
    ``close`` lets go of the folders' descriptors."""

    def __init__(self, folder: str | os.PathLike[str] | None = None, limit: int | None = None) -> None:
        self.place = CacheFolder(Path(folder) if folder is not None else default_cache_dir())
        self.root = self.place.root
        self.folder = self.place.path
        self.limit = default_cache_limit() if limit is None else int(limit)
        if self.limit < 0:
            raise ValueError(f"cache_limit {limit}: give a number of bytes, 0 or more")
        self._lock = threading.Lock()  # writers of this process, in turn (the lock file orders processes)
        self._checked: dict[tuple[str, str], tuple[int, ...]] = {}  # entries whose bytes were checked this open

    def problem(self) -> str | None:
        """Why the cache folder cannot be used (None when it can): it is created if missing."""
        return self.place.problem()

    def close(self) -> None:
        """Let go of the folders' descriptors (the cache opens them again if used)."""
        self.place.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - an interpreter shutting down
            pass

    def forked(self) -> BlockCache:
        """A cache of the same folder and limit for a process forked from this one: what this one
        checked stays checked (its files' identities are compared again), new locks."""
        copy = BlockCache(self.root, self.limit)
        copy._checked = dict(self._checked)
        return copy

    # -- reading ------------------------------------------------------------------------------
    def read(self, pack: str, identity: str, size: int) -> mmap.mmap | None:
        """The bytes of entry ``identity`` of ``pack`` (``size`` of them) as a read-only map, when
        they are there and are what their record says (checked once per entry for this cache);
        None otherwise. An entry whose bytes differ from its record is deleted."""
        folder = self.place.pack_fd(pack, create=False)
        if folder is None:
            return None
        name = entry_name(identity)
        try:
            fd = os.open(name + DATA_SUFFIX, os.O_RDONLY | NONBLOCK | NOFOLLOW | CLOEXEC, dir_fd=folder)  # a FIFO: no wait
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size != size:
                return None
            if size == 0:
                return None  # mmap cannot map an empty file; nothing worth caching
            data = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
            if self._checked.get((pack, name)) == signature(info):
                return data
            if not matches_record(folder, name, identity, info, data):
                data.close()
                return None
            try:
                os.utime(fd)  # least recently used goes first
                info = os.fstat(fd)
            except OSError:
                pass
            self._remember(pack, name, info)
            return data
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)

    def has(self, pack: str, identity: str, size: int) -> bool:
        """Whether entry ``identity`` of ``pack`` seems to be there (a file of ``size`` bytes; not
        checked: ``read`` checks it), for an announcement deciding what to fetch."""
        folder = self.place.pack_fd(pack, create=False)
        if folder is None:
            return False
        try:
            info = os.stat(entry_name(identity) + DATA_SUFFIX, dir_fd=folder, follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISREG(info.st_mode) and info.st_size == size

    def path(self, pack: str, identity: str, size: int) -> Path | None:
        """The file of entry ``identity`` (checked as ``read`` checks it), for a reader that needs a
        path (LMDB); None when it is not there whole."""
        data = self.read(pack, identity, size)
        if data is None:
            return None
        data.close()
        return self.folder / pack / (entry_name(identity) + DATA_SUFFIX)

    def _remember(self, pack: str, name: str, info: os.stat_result) -> None:
        """Entry ``name`` of ``pack``, as the file ``info`` describes, is checked for this open."""
        self._checked[(pack, name)] = signature(info)

    # -- writing ------------------------------------------------------------------------------
    def put(self, pack: str, identity: str, data: bytes | memoryview) -> bool:
        """Keep ``data`` as entry ``identity`` of ``pack``; False when it cannot be kept (larger than
        the limit, or the folder cannot be written: the bytes are then only in memory). The room is
        made, and the entry's whole size taken, under the folder's lock; the bytes are written after."""
        if len(data) + RECORD_ALLOWANCE > self.limit or not len(data):
            return False
        try:
            writing = self.reserve(pack, identity, len(data), within_limit=True)
        except OSError:
            return False
        try:
            view = memoryview(data)
            at = 0
            while at < len(view):
                at += os.pwrite(writing.fd, view[at:], at)
            writing.commit(zlib.crc32(view))
        except OSError:
            writing.abort()
            return False
        return True

    def reserve(self, pack: str, identity: str, size: int, within_limit: bool = False) -> Reservation:
        """Make room for an entry of ``size`` bytes and open its temporary file (``Reservation``: write
        into ``fd``, then ``commit``). OSError when it cannot fit or be written; with ``within_limit``,
        also when the writes under way (which cannot be evicted) leave no room for it now, so that
        the cache never holds more than its limit (a block is then kept in memory only)."""
        if size + RECORD_ALLOWANCE > self.limit:
            raise OSError(errno.EFBIG, f"{size:,} bytes do not fit a cache limited to {self.limit:,}")
        folder = self._pack_folder(pack)
        name = entry_name(identity)
        tmp = temporary_name(name, DATA_SUFFIX)
        with self._writers_turn() as lock:
            if not self._make_room(lock, size + RECORD_ALLOWANCE, within_limit):
                raise OSError(errno.EFBIG, f"{size:,} bytes do not fit the cache's limit of {self.limit:,} now: "
                                           "other writes under way take the room")
            try:
                os.unlink(tmp, dir_fd=folder)  # a leftover of this very thread id of a dead process
            except FileNotFoundError:
                pass
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC, 0o644, dir_fd=folder)
            try:
                os.ftruncate(fd, size)  # holds its place
            except OSError:
                os.close(fd)
                os.unlink(tmp, dir_fd=folder)
                raise
        return Reservation(folder, name, tmp, fd, identity, size, self._writers_turn,
                           partial(self._remember, pack, name))

    # -- room ---------------------------------------------------------------------------------
    def _make_room(self, lock: FileLock, size: int, within_limit: bool = False) -> bool:
        """Room for ``size`` more bytes; False (nothing claimed) where ``within_limit`` and what cannot
        be deleted (writes under way) leaves too little. The folder's lock file records the bytes the
        entries take, so a write that fits needs no look at the folder; one that does not (or a record
        missing or larger than the truth, after files were deleted by hand) walks it, deletes, and
        records anew."""
        recorded = lock.read_number()
        if recorded is not None and recorded + size <= self.limit:
            lock.write_number(recorded + size)
            return True
        total = self.make_room(size)
        if within_limit and total + size > self.limit:
            lock.write_number(total)
            return False
        lock.write_number(total + size)
        return True

    def make_room(self, size: int) -> int:
        """Delete the least recently used entries until ``size`` more bytes fit under the limit, with
        a little to spare so that the next writes need no walk (called with the folder's lock held);
        the bytes the entries left take. Only recorded entries are deleted, and unfinished writes of
        processes that are gone."""
        entries = self.entries()
        total = sum(length for _, _, _, length in entries) + self.writing_bytes()
        target = self.limit - size - min(self.limit // 32, 256 << 20)
        return delete_oldest(self.place, entries, total, target)

    def entries(self) -> list[Entry]:
        """(last use, pack folder, name, bytes) of every entry the cache recorded (its bytes and its
        record), and of every unfinished write of a process that is gone (name with its suffix)."""
        return recorded_entries(self.place)

    def writing_bytes(self) -> int:
        """Bytes of the writes under way now (their temporary files, room already claimed)."""
        return writing_bytes(self.place)

    def used(self) -> int:
        """Bytes the cache's entries take now (the writes under way included)."""
        return sum(length for _, _, _, length in self.entries()) + self.writing_bytes()

    def free_bytes(self) -> int | None:
        """Bytes free on the cache folder's disk (None when it cannot be told)."""
        try:
            return shutil.disk_usage(self.folder).free
        except OSError:
            return None

    # -- locks --------------------------------------------------------------------------------
    def fetching(self, pack: str, identity: str) -> FileLock:
        """A lock on entry ``identity`` held while it is fetched (``with cache.fetching(...)``): another
        process asking for it waits until it is done. The lock file is removed when released.
        OSError when the cache folder cannot be used."""
        return FileLock(self._pack_folder(pack), entry_name(identity) + FETCHING_MARK, remove=True)

    def _pack_folder(self, pack: str) -> int:
        """The descriptor of pack folder ``pack``, made when missing; ``CacheUnusableError`` saying why
        when it cannot be."""
        folder = self.place.pack_fd(pack, create=True)
        if folder is None:
            raise CacheUnusableError(self.problem() or f"{self.folder}/{pack} is not a folder of packload's cache")
        return folder

    def _folder_lock(self) -> FileLock:
        return FileLock(self.place.fd(), LOCK_NAME)

    @contextlib.contextmanager
    def _writers_turn(self) -> Iterator[FileLock]:
        """This process's writers in turn (a thread lock), then the processes' (the folder's lock file)."""
        with self._lock, self._folder_lock() as lock:
            yield lock
