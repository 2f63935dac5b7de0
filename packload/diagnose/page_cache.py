"""Warm, empty and inspect the page cache for a list of files, to time reads from memory and from storage.

``evict`` writes dirty pages out (``os.sync``) and asks the kernel to drop each file's cached pages
(``posix_fadvise(POSIX_FADV_DONTNEED)``); ``resident_fraction`` checks what is still cached with
``mincore(2)`` on a read-only mapping of each file. Eviction is a request: pages mapped by another
process, files on tmpfs and some network or FUSE filesystems stay cached, which is why it is checked.
It drops file data only, not the kernel's inode and directory caches.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import os
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from packload.core.libc import libc_function

PAGE = mmap.PAGESIZE
READ_BLOCK = 8 << 20
_PROT_READ, _MAP_SHARED = 0x1, 0x01
_MAP_FAILED = ctypes.c_void_p(-1).value


@functools.cache
def _c() -> Any:
    """mmap, munmap and mincore from the C library, with their prototypes (looked up once)."""
    mmap_ = libc_function("mmap", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_long], ctypes.c_void_p)
    munmap = libc_function("munmap", [ctypes.c_void_p, ctypes.c_size_t])
    mincore = libc_function("mincore", [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)])
    if mmap_ is None or munmap is None or mincore is None:
        raise OSError("no C library with mmap and mincore here")
    return types.SimpleNamespace(mmap=mmap_, munmap=munmap, mincore=mincore)


def resident_pages(path: str | os.PathLike[str]) -> tuple[int, int]:
    """(pages in the page cache, pages in the file), by ``mincore`` on a read-only shared mapping.

    Mapping a file does not read it, so this changes nothing. Raises OSError when it cannot map.
    """
    libc = _c()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return 0, 0
        address = libc.mmap(None, size, _PROT_READ, _MAP_SHARED, f.fileno(), 0)
        if address in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap failed: {os.strerror(ctypes.get_errno())}", str(path))
        try:
            pages = (size + PAGE - 1) // PAGE
            vector = (ctypes.c_ubyte * pages)()
            if libc.mincore(ctypes.c_void_p(address), size, vector) != 0:
                raise OSError(ctypes.get_errno(), f"mincore failed: {os.strerror(ctypes.get_errno())}", str(path))
            return sum(b & 1 for b in bytes(vector)), pages
        finally:
            libc.munmap(ctypes.c_void_p(address), size)


def _sample(paths: Sequence[str], limit: int) -> list[str]:
    """At most ``limit`` paths spread evenly over ``paths`` (all of them when there are few)."""
    if len(paths) <= limit:
        return list(paths)
    step = len(paths) / limit
    return [paths[int(i * step)] for i in range(limit)]


def can_report(path: str | os.PathLike[str]) -> bool:
    """Since Linux 5.2 ``mincore`` answers "all cached" for files the caller neither owns nor may write
    (a side-channel fix), so only such files give a true answer."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return os.geteuid() == 0 or st.st_uid == os.geteuid() or os.access(path, os.W_OK)


def resident_fraction(paths: Sequence[str], limit: int = 256) -> float | None:
    """Share of the pages of (a sample of at most ``limit``) ``paths`` that are in the page cache;
    None when no file could be checked truthfully (see ``can_report``)."""
    cached = total = 0
    for path in _sample(paths, limit):
        if not can_report(path):
            continue
        try:
            here, pages = resident_pages(path)
        except OSError:
            continue
        cached, total = cached + here, total + pages
    return cached / total if total else None


def warm(paths: Sequence[str]) -> int:
    """Read every file once, so its pages are in the page cache; returns the bytes read."""
    done = 0
    buffer = bytearray(READ_BLOCK)
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while count := f.readinto(buffer):
                done += count
    return done


@dataclass(frozen=True)
class Eviction:
    """What ``evict`` did: files asked, files it failed on, and the cached share before and after."""

    files: int
    failed: int
    before: float | None
    after: float | None

    @property
    def verified(self) -> bool | None:
        """True when mincore confirms the pages left (at most 5 % still cached), None when unknown."""
        return None if self.after is None else self.after <= 0.05


def drop(path: str | os.PathLike[str]) -> None:
    """Ask the kernel to drop ``path``'s clean cached pages."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def evict(paths: Sequence[str], check_limit: int = 256) -> Eviction:
    """Flush dirty pages, drop every file's cached pages, and check with ``mincore`` that they left."""
    before = resident_fraction(paths, check_limit)
    os.sync()
    failed = 0
    for path in paths:
        try:
            drop(path)
        except OSError:
            failed += 1
    return Eviction(len(paths), failed, before, resident_fraction(paths, check_limit))
