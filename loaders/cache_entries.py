"""One entry of the block cache on disk: its file names, its record, the check of its bytes, its writing.

Each entry (a block of a shard, a pack's index, a whole LMDB file) is two files in the folder of
its pack (``pack-<hash of the manifest>``, ``lmdb-<hash of the object's version>``): the bytes,
``<hash of identity>.blk``, and the record of what they are, ``<hash of identity>.rec`` (a small
JSON object: the identity, e.g. the shard, the block size and the block's number; the length; the
CRC-32 of the bytes; the inode of the bytes' file), written when the entry is written. An entry is
read only when its record names the identity asked for and the length, and the bytes' CRC-32 is
the one recorded; anything else is a miss, and an entry whose bytes do not match its own record is
deleted, so it is fetched again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import re
import stat
import threading
import zlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from packload.loaders.cache_folder import CLOEXEC, NOFOLLOW, NONBLOCK

DATA_SUFFIX = ".blk"
RECORD_SUFFIX = ".rec"
TMP_MARK = ".tmp-"
RECORD_ALLOWANCE = 512  # bytes counted for an entry's record before it is written
RECORD_LIMIT = 4096  # a record file larger than this is not one of ours
ENTRY = re.compile(r"[0-9a-f]{40}")  # an entry's name, without its suffix
TMP = re.compile(r"([0-9a-f]{40})\.(blk|rec)\.tmp-(\d+)-\d+")  # a write under way: name, suffix, pid


def entry_name(identity: str) -> str:
    """The file name (without suffix) of the entry ``identity``: its hash, so any identity names a
    plain file of a fixed form."""
    return hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def temporary_name(name: str, suffix: str) -> str:
    """The file that entry ``name``'s ``suffix`` file is written as by this thread, until put in place."""
    return f"{name}{suffix}{TMP_MARK}{os.getpid()}-{threading.get_ident()}"


def signature(info: os.stat_result) -> tuple[int, ...]:
    """What tells a file apart from the same file changed: inode, size, change and modification times."""
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def read_record(folder: int, name: str) -> dict[str, Any] | None:
    """The record of entry ``name`` (None when missing, a link, too large, or not ours)."""
    try:
        fd = os.open(name + RECORD_SUFFIX, os.O_RDONLY | NONBLOCK | NOFOLLOW | CLOEXEC, dir_fd=folder)  # a FIFO: no wait
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


def matches_record(folder: int, name: str, identity: str, info: os.stat_result, data: Any) -> bool:
    """Whether the record of entry ``name`` names ``identity``, this file and its length, and the
    bytes' CRC-32 is the one recorded; deletes the entry when its bytes are not what it recorded."""
    record = read_record(folder, name)
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


class Reservation:
    """A temporary file of an entry being written (``BlockCache.reserve``): write its bytes into
    ``fd``, then ``commit`` (or ``abort``).

    ``turn`` gives the cache's writers' turn (its lock), under which the entry is put in place;
    ``placed`` is told the stat of the bytes' file once they are in place."""

    def __init__(self, folder: int, name: str, tmp: str, fd: int, identity: str, size: int,
                 turn: Callable[[], AbstractContextManager[Any]], placed: Callable[[os.stat_result], None]) -> None:
        self.folder, self.name, self.tmp, self.fd = folder, name, tmp, fd
        self.identity, self.size = identity, size
        self.turn, self.placed = turn, placed

    def commit(self, crc32: int | None = None) -> None:
        """Record the entry (its identity, length, CRC-32: of the file's bytes unless given) and put
        its bytes in place: the record first, so that bytes in place always have their record."""
        record_tmp = temporary_name(self.name, RECORD_SUFFIX)
        try:
            if crc32 is None:
                with mmap.mmap(self.fd, self.size, access=mmap.ACCESS_READ) as data:
                    crc32 = zlib.crc32(data)
            inode = os.fstat(self.fd).st_ino
            record = json.dumps({"packload_cache": 1, "identity": self.identity, "length": self.size,
                                 "crc32": crc32, "inode": inode}).encode()
            fd = os.open(record_tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | NOFOLLOW | CLOEXEC, 0o644,
                         dir_fd=self.folder)
            try:
                os.write(fd, record)
            finally:
                os.close(fd)
            # Under the folder's lock: a walk (make_room) sees the entry either as a write under way or
            # as an entry, never between the two, when it would count it as neither and overfill.
            with self.turn():
                os.replace(record_tmp, self.name + RECORD_SUFFIX, src_dir_fd=self.folder, dst_dir_fd=self.folder)
                os.replace(self.tmp, self.name + DATA_SUFFIX, src_dir_fd=self.folder, dst_dir_fd=self.folder)
            try:
                info = os.stat(self.name + DATA_SUFFIX, dir_fd=self.folder, follow_symlinks=False)
                if info.st_ino == inode:
                    self.placed(info)  # written here: checked
            except OSError:
                pass
        except BaseException:
            self.abort()
            with contextlib.suppress(OSError):  # the record's temporary file too, unless it was put in place
                os.unlink(record_tmp, dir_fd=self.folder)
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
