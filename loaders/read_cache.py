"""A bounded local cache of byte blocks fetched from an object store, that owns only what it wrote.

**Where.** The cache lives in a folder of its own, ``packload-blocks``, inside the cache folder the
user gives (``cache_dir``; default ``$PACKLOAD_CACHE``, else ``$XDG_CACHE_HOME/packload``, else
``~/.cache/packload``). That folder may be shared with other programs and hold the user's files:
packload never lists, evicts, opens or writes anything in it but its own subfolder. The subfolder
holds a ``CACHEDIR.TAG`` marker that names it as packload's block cache; a ``packload-blocks``
that exists without the marker and holds anything is not used (its files are someone else's). A
``cache_dir`` that is a symbolic link is resolved once, when the cache is opened, and the folder it
names is used (a cache folder linked to a larger disk is common); nothing below it is ever
followed: every folder and file of the cache is opened relative to its folder's descriptor with
``O_NOFOLLOW``, so a link planted there is neither read through nor written through.

**Entries.** Each entry (a block of a shard, a pack's index, a whole LMDB file) is two files in the
folder of its pack (``pack-<hash of the manifest>``, ``lmdb-<hash of the object's version>``): the
bytes, ``<hash of identity>.blk``, and the record of what they are, ``<hash of identity>.rec`` (a
small JSON object: the identity, e.g. the shard, the block size and the block's number; the
length; the CRC-32 of the bytes; the inode of the bytes' file), written when the entry is written.
An entry is read only when its record names the identity asked for and the length, and the bytes'
CRC-32 is the one recorded (checked once per entry and open: a reader remembers what it checked,
by the file's inode, size and change times); anything else is a miss, and an entry whose bytes do
not match its own record is deleted, so it is fetched again.

**Limit.** The entries never take more than ``limit`` bytes together: before an entry is written,
the least recently used ones are deleted until it fits. Only entries the cache recorded are
deleted (a ``.blk`` with its ``.rec``, in a pack folder of the cache), and unfinished writes of
processes that are gone. Writers in several processes take turns under a lock file, which also
records the bytes the entries take, so a write that fits needs no walk over the folder. An entry
larger than the whole limit is not kept.

``fetching(pack, identity)`` is a lock of one entry across processes (and threads): the one that
holds it fetches the bytes, and another that wants the same entry waits for it and then reads the
cached file, so DataLoader workers and the sampler's announcements never fetch one block twice.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import mmap
import os
import re
import shutil
import stat
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from packload.core.errors import UsageError
from packload.core.storage import unwritable_reason

DEFAULT_CACHE_LIMIT = 20 << 30  # bytes: a few epochs' worth of a mid-sized pack
CACHE_SUBFOLDER = "packload-blocks"  # packload's own folder inside the cache folder given
MARKER_NAME = "CACHEDIR.TAG"
# The cache directory tag (bford.ch/cachedir): backup tools skip the folder; our second line says whose it is.
MARKER = (b"Signature: 8a477f597d28d172789f06886806bc55\n"
          b"# packload's block cache: packload deletes only the entries it recorded here.\n")
LOCK_NAME = ".lock"
DATA_SUFFIX = ".blk"
RECORD_SUFFIX = ".rec"
FETCHING_MARK = ".fetching"  # suffix of an entry's lock file while a process fetches it
_TMP_MARK = ".tmp-"
RECORD_ALLOWANCE = 512  # bytes counted for an entry's record before it is written
RECORD_LIMIT = 4096  # a record file larger than this is not one of ours
STALE_SECONDS = 600  # an unfinished write of a process that is gone, this old, is deleted
_PACK_FOLDER = re.compile(r"(pack|lmdb)-[0-9a-f]{32}")
_ENTRY = re.compile(r"[0-9a-f]{40}")
_TMP = re.compile(r"([0-9a-f]{40})\.(blk|rec)\.tmp-(\d+)-\d+")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC


def default_cache_dir() -> Path:
    """``$PACKLOAD_CACHE``, else ``$XDG_CACHE_HOME/packload``, else ``~/.cache/packload`` (packload's
    files go into its ``packload-blocks`` subfolder)."""
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


def entry_name(identity: str) -> str:
    """The file name (without suffix) of the entry ``identity``: its hash, so any identity names a
    plain file of a fixed form."""
    return hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def pack_folder_name(kind: str, identity: str) -> str:
    """The folder of one pack's entries: ``pack-<hash>`` (a shards pack, by its manifest) or
    ``lmdb-<hash>`` (an LMDB object, by its URL and version)."""
    if kind not in ("pack", "lmdb"):
        raise ValueError(f"kind {kind!r}: pack or lmdb")
    return f"{kind}-{hashlib.sha256(identity.encode('utf-8', 'surrogatepass')).hexdigest()[:32]}"


class CacheUnusableError(OSError):
    """The cache folder cannot be used; the message says why."""


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


class BlockCache:
    """Entries of fetched bytes in ``folder/packload-blocks``, never more than ``limit`` bytes in all.

    A reader opens one per pack it opens (its memory of the entries it checked is per open);
    ``close`` lets go of the folders' descriptors."""

    def __init__(self, folder: str | os.PathLike[str] | None = None, limit: int | None = None) -> None:
        self.root = Path(folder) if folder is not None else default_cache_dir()
        self.folder = Path(os.path.realpath(self.root)) / CACHE_SUBFOLDER  # a link given is followed here, once
        self.limit = default_cache_limit() if limit is None else int(limit)
        if self.limit < 0:
            raise ValueError(f"cache_limit {limit}: give a number of bytes, 0 or more")
        self._lock = threading.Lock()  # writers of this process, in turn (the lock file orders processes)
        self._fds_lock = threading.Lock()
        self._fd: int | None = None
        self._packs: dict[str, int] = {}
        self._checked: dict[tuple[str, str], tuple[int, ...]] = {}  # entries whose bytes were checked this open

    # -- the folder ---------------------------------------------------------------------------
    def problem(self) -> str | None:
        """Why the cache folder cannot be used (None when it can): it is created if missing."""
        try:
            self._folder_fd()
        except CacheUnusableError as exc:
            return str(exc)
        return None

    def _folder_fd(self) -> int:
        """The descriptor of ``packload-blocks``, created with its marker when missing;
        ``CacheUnusableError`` saying why when it cannot be used."""
        with self._fds_lock:
            if self._fd is None:
                self._fd = self._open_folder()
            return self._fd

    def _open_folder(self) -> int:
        parent = self.folder.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheUnusableError(self._unusable(parent, exc)) from None
        if not parent.is_dir():
            raise CacheUnusableError(f"{self.root} is not a folder")
        try:
            parent_fd = os.open(parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
        except OSError as exc:
            raise CacheUnusableError(self._unusable(parent, exc)) from None
        try:
            try:
                os.mkdir(CACHE_SUBFOLDER, 0o755, dir_fd=parent_fd)
            except FileExistsError:
                pass
            except OSError as exc:
                raise CacheUnusableError(self._unusable(parent, exc)) from None
            try:
                fd = os.open(CACHE_SUBFOLDER, _DIR_FLAGS, dir_fd=parent_fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise CacheUnusableError(f"{self.folder} is a symbolic link or a file, not packload's cache "
                                             "folder; move it away, or give another cache_dir") from None
                raise CacheUnusableError(self._unusable(self.folder, exc)) from None
        finally:
            os.close(parent_fd)
        try:
            self._check_marker(fd)
            if not os.access(self.folder, os.W_OK | os.X_OK):
                raise CacheUnusableError(f"{self.folder} cannot be written (permission denied)")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _unusable(self, place: Path, exc: OSError) -> str:
        why = unwritable_reason(place)
        if why:
            return f"{place} cannot be written: {why}"
        if exc.errno == errno.ENOSPC:
            return f"{place} cannot be written: its disk is full"
        if exc.errno in (errno.ENOTDIR, errno.EEXIST):
            return f"{place} is not a folder (a file is in the way)"
        return f"{place} cannot be used ({_reason(exc)})"

    def _check_marker(self, fd: int) -> None:
        """The folder must be packload's: its marker there, or nothing at all there (then marked now)."""
        try:
            marker = os.open(MARKER_NAME, os.O_RDONLY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
        except FileNotFoundError:
            if os.listdir(fd):
                raise CacheUnusableError(f"{self.folder} holds files that are not packload's (no {MARKER_NAME} of "
                                         "packload's there), so packload leaves it alone; give another cache_dir, "
                                         "or move that folder away") from None
            try:
                marker = os.open(MARKER_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o644,
                                 dir_fd=fd)
                try:
                    os.write(marker, MARKER)
                finally:
                    os.close(marker)
            except FileExistsError:
                pass  # another process marked it meanwhile
            except OSError as exc:
                raise CacheUnusableError(self._unusable(self.folder, exc)) from None
            return
        except OSError as exc:
            raise CacheUnusableError(f"{self.folder}/{MARKER_NAME} cannot be read ({_reason(exc)}): not packload's "
                                     "cache folder; give another cache_dir") from None
        try:
            text = os.read(marker, len(MARKER) + 1)
        finally:
            os.close(marker)
        if text != MARKER:
            raise CacheUnusableError(f"{self.folder}/{MARKER_NAME} is not packload's marker, so packload leaves the "
                                     "folder alone; give another cache_dir")

    def _pack_fd(self, pack: str, create: bool) -> int | None:
        """The descriptor of the pack folder ``pack`` (made when ``create``); None when it is not
        there, or is not a folder of ours (a link, a file)."""
        if not _PACK_FOLDER.fullmatch(pack):
            raise ValueError(f"{pack!r}: not a cache folder's name (pack_folder_name gives them)")
        with self._fds_lock:
            found = self._packs.get(pack)
        if found is not None:
            return found
        try:
            root = self._folder_fd()
        except CacheUnusableError:
            return None
        if create:
            try:
                os.mkdir(pack, 0o755, dir_fd=root)
            except FileExistsError:
                pass
            except OSError:
                return None
        try:
            fd = os.open(pack, _DIR_FLAGS, dir_fd=root)
        except OSError:
            return None
        with self._fds_lock:
            if pack in self._packs:  # another thread opened it meanwhile
                os.close(fd)
                return self._packs[pack]
            self._packs[pack] = fd
        return fd

    def close(self) -> None:
        """Let go of the folders' descriptors (the cache opens them again if used)."""
        with self._fds_lock:
            fds = [*self._packs.values(), *([self._fd] if self._fd is not None else [])]
            self._packs, self._fd = {}, None
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

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
        folder = self._pack_fd(pack, create=False)
        if folder is None:
            return None
        name = entry_name(identity)
        try:
            fd = os.open(name + DATA_SUFFIX, os.O_RDONLY | _NOFOLLOW | _CLOEXEC, dir_fd=folder)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size != size:
                return None
            if size == 0:
                return None  # mmap cannot map an empty file; nothing worth caching
            data = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
            if self._checked.get((pack, name)) == _signature(info):
                return data
            if not self._matches_record(folder, name, identity, info, data):
                data.close()
                return None
            try:
                os.utime(fd)  # least recently used goes first
                info = os.fstat(fd)
            except OSError:
                pass
            self._checked[(pack, name)] = _signature(info)
            return data
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)

    def has(self, pack: str, identity: str, size: int) -> bool:
        """Whether entry ``identity`` of ``pack`` seems to be there (a file of ``size`` bytes; not
        checked: ``read`` checks it), for an announcement deciding what to fetch."""
        folder = self._pack_fd(pack, create=False)
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

    def _matches_record(self, folder: int, name: str, identity: str, info: os.stat_result, data: Any) -> bool:
        """Whether the record of entry ``name`` names ``identity``, this file and its length, and the
        bytes' CRC-32 is the one recorded; deletes the entry when its bytes are not what it recorded."""
        record = _read_record(folder, name)
        if record is None or record.get("identity") != identity or record.get("length") != info.st_size:
            return False
        if record.get("inode") != info.st_ino:
            return False  # written again meanwhile, its record first: the next look finds both
        if zlib.crc32(data) == record.get("crc32"):
            return True
        for suffix in (DATA_SUFFIX, RECORD_SUFFIX):  # damaged: ours to delete, then fetched again
            try:
                os.unlink(name + suffix, dir_fd=folder)
            except OSError:
                pass
        return False

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
        folder = self._pack_fd(pack, create=True)
        if folder is None:
            raise CacheUnusableError(self.problem() or f"{self.folder}/{pack} is not a folder of packload's cache")
        name = entry_name(identity)
        tmp = f"{name}{DATA_SUFFIX}{_TMP_MARK}{os.getpid()}-{threading.get_ident()}"
        with self._lock, self._folder_lock() as lock:
            if not self._make_room(lock, size + RECORD_ALLOWANCE, within_limit):
                raise OSError(errno.EFBIG, f"{size:,} bytes do not fit the cache's limit of {self.limit:,} now: "
                                           "other writes under way take the room")
            try:
                os.unlink(tmp, dir_fd=folder)  # a leftover of this very thread id of a dead process
            except FileNotFoundError:
                pass
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o644, dir_fd=folder)
            try:
                os.ftruncate(fd, size)  # holds its place
            except OSError:
                os.close(fd)
                os.unlink(tmp, dir_fd=folder)
                raise
        return Reservation(self, pack, folder, name, tmp, fd, identity, size)

    def _make_room(self, lock: _FileLock, size: int, within_limit: bool = False) -> bool:
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
        for _, pack, name, length in sorted(entries):
            if total <= target:
                break
            folder = self._pack_fd(pack, create=False)
            if folder is None:
                continue
            gone = False
            for suffix in (DATA_SUFFIX, RECORD_SUFFIX) if _ENTRY.fullmatch(name) else ("",):
                try:
                    os.unlink(name + suffix, dir_fd=folder)
                    gone = True
                except FileNotFoundError:
                    gone = True
                except OSError:
                    pass
            if gone:
                total -= length
        return total

    def entries(self) -> list[tuple[float, str, str, int]]:
        """(last use, pack folder, name, bytes) of every entry the cache recorded (its bytes and its
        record), and of every unfinished write of a process that is gone (name with its suffix)."""
        found: list[tuple[float, str, str, int]] = []
        for pack, folder in self._pack_folders():
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            present = set(names)
            for item in names:
                if item.endswith(RECORD_SUFFIX) and _ENTRY.fullmatch(item[: -len(RECORD_SUFFIX)]):
                    found += self._recorded(folder, pack, item[: -len(RECORD_SUFFIX)], present)
                elif _TMP.fullmatch(item):
                    found += self._abandoned(folder, pack, item)
        return found

    def _recorded(self, folder: int, pack: str, name: str, present: set[str]) -> list[tuple[float, str, str, int]]:
        record = _read_record(folder, name)
        if record is None:
            return []
        try:
            kept = os.stat(name + RECORD_SUFFIX, dir_fd=folder, follow_symlinks=False).st_size
        except OSError:
            return []
        if name + DATA_SUFFIX not in present:  # the writer died between its record and its bytes
            return [(0.0, pack, name, kept)]
        try:
            info = os.stat(name + DATA_SUFFIX, dir_fd=folder, follow_symlinks=False)
        except OSError:
            return []
        if not stat.S_ISREG(info.st_mode):
            return []
        return [(info.st_mtime, pack, name, info.st_size + kept)]

    def writing_bytes(self) -> int:
        """Bytes of the writes under way now (their temporary files, room already claimed): counted
        by a walk, never deleted by it."""
        total = 0
        for _, folder in self._pack_folders():
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for item in names:
                match = _TMP.fullmatch(item)
                if match and match.group(2) == "blk":
                    try:
                        info = os.stat(item, dir_fd=folder, follow_symlinks=False)
                    except OSError:
                        continue
                    if _alive(int(match.group(3))) or time.time() - info.st_mtime < STALE_SECONDS:
                        total += info.st_size
        return total

    def _pack_folders(self) -> list[tuple[str, int]]:
        """(name, descriptor) of every pack folder of the cache (real folders of the names it gives)."""
        try:
            root = self._folder_fd()
        except CacheUnusableError:
            return []
        with os.scandir(root) as packs:
            names = [e.name for e in packs if _PACK_FOLDER.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
        found = []
        for pack in names:
            folder = self._pack_fd(pack, create=False)
            if folder is not None:
                found.append((pack, folder))
        return found

    def _abandoned(self, folder: int, pack: str, item: str) -> list[tuple[float, str, str, int]]:
        """An unfinished write ``item`` whose process is gone and which is old: (0, pack, item, bytes)."""
        match = _TMP.fullmatch(item)
        assert match is not None
        pid = int(match.group(3))
        try:
            info = os.stat(item, dir_fd=folder, follow_symlinks=False)
        except OSError:
            return []
        if not stat.S_ISREG(info.st_mode) or time.time() - info.st_mtime < STALE_SECONDS or _alive(pid):
            return []
        return [(0.0, pack, item, info.st_size)]

    def used(self) -> int:
        """Bytes the cache's entries take now (the writes under way included)."""
        return sum(length for _, _, _, length in self.entries()) + self.writing_bytes()

    def fetching(self, pack: str, identity: str) -> _FileLock:
        """A lock on entry ``identity`` held while it is fetched (``with cache.fetching(...)``): another
        process asking for it waits until it is done. The lock file is removed when released.
        OSError when the cache folder cannot be used."""
        folder = self._pack_fd(pack, create=True)
        if folder is None:
            raise CacheUnusableError(self.problem() or f"{self.folder}/{pack} is not a folder of packload's cache")
        return _FileLock(folder, entry_name(identity) + FETCHING_MARK, remove=True)

    def _folder_lock(self) -> _FileLock:
        return _FileLock(self._folder_fd(), LOCK_NAME)

    def free_bytes(self) -> int | None:
        """Bytes free on the cache folder's disk (None when it cannot be told)."""
        try:
            return shutil.disk_usage(self.folder).free
        except OSError:
            return None


class Reservation:
    """A temporary file of an entry being written (``BlockCache.reserve``): write its bytes into
    ``fd``, then ``commit`` (or ``abort``)."""

    def __init__(self, cache: BlockCache, pack: str, folder: int, name: str, tmp: str, fd: int, identity: str,
                 size: int) -> None:
        self.cache, self.pack, self.folder, self.name, self.tmp = cache, pack, folder, name, tmp
        self.fd, self.identity, self.size = fd, identity, size

    def commit(self, crc32: int | None = None) -> None:
        """Record the entry (its identity, length, CRC-32: of the file's bytes unless given) and put
        its bytes in place: the record first, so that bytes in place always have their record."""
        try:
            if crc32 is None:
                with mmap.mmap(self.fd, self.size, access=mmap.ACCESS_READ) as data:
                    crc32 = zlib.crc32(data)
            inode = os.fstat(self.fd).st_ino
            record = json.dumps({"packload_cache": 1, "identity": self.identity, "length": self.size,
                                 "crc32": crc32, "inode": inode}).encode()
            record_tmp = f"{self.name}{RECORD_SUFFIX}{_TMP_MARK}{os.getpid()}-{threading.get_ident()}"
            fd = os.open(record_tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW | _CLOEXEC, 0o644,
                         dir_fd=self.folder)
            try:
                os.write(fd, record)
            finally:
                os.close(fd)
            # Under the folder's lock: a walk (make_room) sees the entry either as a write under way or
            # as an entry, never between the two, when it would count it as neither and overfill.
            with self.cache._lock, self.cache._folder_lock():
                os.replace(record_tmp, self.name + RECORD_SUFFIX, src_dir_fd=self.folder, dst_dir_fd=self.folder)
                os.replace(self.tmp, self.name + DATA_SUFFIX, src_dir_fd=self.folder, dst_dir_fd=self.folder)
            try:
                info = os.stat(self.name + DATA_SUFFIX, dir_fd=self.folder, follow_symlinks=False)
                if info.st_ino == inode:
                    self.cache._checked[(self.pack, self.name)] = _signature(info)  # written here: checked
            except OSError:
                pass
        except BaseException:
            self.abort()
            raise
        finally:
            self._close()

    def abort(self) -> None:
        """Delete the temporary file (the room it took is found again by the next walk)."""
        self._close()
        try:
            os.unlink(self.tmp, dir_fd=self.folder)
        except OSError:
            pass

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _signature(info: os.stat_result) -> tuple[int, ...]:
    """What tells a file apart from the same file changed: inode, size, change and modification times."""
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _read_record(folder: int, name: str) -> dict[str, Any] | None:
    """The record of entry ``name`` (None when missing, a link, too large, or not ours)."""
    try:
        fd = os.open(name + RECORD_SUFFIX, os.O_RDONLY | _NOFOLLOW | _CLOEXEC, dir_fd=folder)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, RECORD_LIMIT + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) > RECORD_LIMIT:
        return None
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or record.get("packload_cache") != 1 or entry_name(str(record.get("identity"))) != name:
        return None
    return record


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


class _FileLock:
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

    def __enter__(self) -> _FileLock:
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
