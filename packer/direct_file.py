"""Write a new file with ``O_DIRECT``: bytes go from one aligned buffer to the disk, not through the
page cache.

Written through the page cache, every byte of a pack costs the kernel a copy into freshly allocated
cache pages, a large share of the CPU time of packing raw pixels.
A pack is written once and read later (often on another machine), so caching it buys nothing, and
it pushes the user's own files out of the cache. Here each byte is copied once, in user space (numpy,
GIL released), into a page-aligned staging buffer, and whole 4 KiB blocks go to the disk from there.
The file's last partial block is written padded with zeros, and the file cut back to its true length
(on ``expose`` for a checkpoint and on ``close``), so nothing is ever read or written through the
page cache and the file's bytes are exactly those appended.

Only on local disk file systems (ext4, XFS, Btrfs, F2FS, ZFS, bcachefs, overlays of them): on
network and FUSE file systems a direct write waits for the far side, and on tmpfs the page cache is
the storage. Elsewhere, and where the file system refuses ``O_DIRECT`` at open,
``DirectAppender.open`` returns None and the caller writes through the page cache as before; a file
system that accepts the flag but refuses the writes is switched back to plain writes on the spot,
with nothing lost.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import mmap
import os
import sys
from pathlib import Path

import numpy as np

from packload.core.libc import libc_function

ALIGN = 4096  # O_DIRECT needs offsets, lengths and addresses aligned to the device's block size (≤ 4 KiB)
STAGE = 8 << 20  # bytes staged before they are written (a multiple of ALIGN)
_O_DIRECT = getattr(os, "O_DIRECT", 0)
# statfs f_type of local disk file systems: ext2/3/4, XFS, Btrfs, F2FS, ZFS, bcachefs, overlayfs
LOCAL_DISK_FS = frozenset((0xEF53, 0x58465342, 0x9123683E, 0xF2F52010, 0x2FC12FC1, 0xCA451A4E, 0x794C7630))


_statfs = libc_function("statfs", [ctypes.c_char_p, ctypes.c_void_p])  # None: no direct writes


def filesystem_type(path: Path) -> int | None:
    """The ``statfs`` magic number of the file system holding ``path`` (a folder), or None."""
    if _statfs is None:
        return None
    buffer = ctypes.create_string_buffer(512)  # struct statfs is 120 bytes on 64-bit Linux
    if _statfs(os.fsencode(path), buffer) != 0:
        return None
    return int.from_bytes(buffer.raw[: ctypes.sizeof(ctypes.c_long)], sys.byteorder) & 0xFFFFFFFF


class DirectAppender:
    """Appends bytes to a new file with ``O_DIRECT``, from one thread; ``close`` when done."""

    def __init__(self, fd: int, stage_bytes: int = STAGE) -> None:
        self._fd = fd
        self._stage = mmap.mmap(-1, stage_bytes + ALIGN)  # anonymous memory: page-aligned
        self._buffer = np.frombuffer(self._stage, dtype=np.uint8)
        self._capacity = stage_bytes
        self._fill = 0  # bytes staged, not yet written in whole blocks
        self._base = 0  # file offset of the stage's first byte (a multiple of ALIGN)
        self.direct = True  # False once the file system refused an O_DIRECT write

    @classmethod
    def open(cls, path: Path) -> DirectAppender | None:
        """A new, empty file at ``path`` opened for direct writes, or None where the platform or the
        file system does not take them (the caller then writes as usual)."""
        if not _O_DIRECT or filesystem_type(Path(path).parent) not in LOCAL_DISK_FS:
            return None
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | _O_DIRECT, 0o666)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return None
            raise
        return cls(fd)

    @property
    def size(self) -> int:
        """Bytes appended so far."""
        return self._base + self._fill

    def write(self, data: bytes | bytearray | memoryview | np.ndarray) -> None:
        """Append ``data`` (copied: the caller may reuse it afterwards)."""
        source = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1)
        at = 0
        while at < len(source):
            take = min(self._capacity - self._fill, len(source) - at)
            self._buffer[self._fill : self._fill + take] = source[at : at + take]
            self._fill += take
            at += take
            if self._fill == self._capacity:
                self._write_blocks()

    def _write_blocks(self) -> None:
        """Write the staged whole blocks; keep the partial last one staged, at the start."""
        whole = self._fill - self._fill % ALIGN
        if not whole:
            return
        self._pwrite(whole)
        rest = self._fill - whole  # < ALIGN <= whole: the move below cannot overlap
        self._buffer[:rest] = self._buffer[whole : self._fill]
        self._base += whole
        self._fill = rest

    def _pwrite(self, length: int) -> None:
        """Write ``length`` staged bytes at the stage's file offset (all of them, or raise)."""
        done = 0
        while done < length:
            try:
                written = os.pwrite(self._fd, self._buffer[done:length], self._base + done)
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self.direct:
                    raise
                self._plain_writes()  # O_DIRECT taken at open, refused here: go on through the cache
                continue
            if written <= 0:
                raise OSError(errno.EIO, "write made no progress")
            done += written

    def _plain_writes(self) -> None:
        flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
        fcntl.fcntl(self._fd, fcntl.F_SETFL, flags & ~_O_DIRECT)
        self.direct = False

    def expose(self) -> None:
        """Make every byte appended so far part of the file (a checkpoint: survives the process).
        Whole blocks, then the partial last one padded with zeros, and the file cut back to its true
        length; the tail stays staged, so later appends rewrite its block."""
        self._write_blocks()
        if not self._fill:
            return
        padded = -(-self._fill // ALIGN) * ALIGN if self.direct else self._fill
        self._buffer[self._fill : padded] = 0
        self._pwrite(padded)
        os.ftruncate(self._fd, self._base + self._fill)

    def close(self) -> None:
        """Write everything and close the file (no fsync: the caller decides when to sync)."""
        try:
            self.expose()
        finally:
            os.close(self._fd)
            self._buffer = np.empty(0, dtype=np.uint8)
            try:
                self._stage.close()
            except BufferError:  # a view still held (by a traceback): the map goes with the last of them
                pass
