"""Append to a file from background threads, hashing as it goes: the caller's thread only collects
references to the bytes; one thread hashes each block of about 4 MiB (SHA-256) and another writes
it, all with the GIL released, so hashing one block overlaps writing the previous one. Small
records are joined into one block first (one large hash call per block, rather than one per record,
keeps them cheap); large ones are hashed one by one and written with ``writev``, uncopied. Memory
stays bounded: at most ``depth`` blocks wait to be hashed and two to be written. A new file goes
to the disk past the page cache (``O_DIRECT``, see ``direct_file``) where the file system allows;
elsewhere, after each block the writing thread asks the kernel to start writing it to disk
(``start_writeback``), so the disk works while packing goes on and the final fsync has little left
to wait for."""

from __future__ import annotations

import ctypes
import hashlib
import os
import queue
import threading
from pathlib import Path
from typing import Any

from packload.core.libc import libc_function
from packload.packer.direct_file import DirectAppender

BLOCK = 4 << 20
MAX_PIECES = 4096  # records per block at most, however small
# Blocks whose pieces are this large on average are hashed piece by piece and written with
# ``writev``, without joining them into one block first (a copy of every byte, into fresh memory).
LARGE_PIECES = 8 << 10
IOV_MAX = 1024  # pieces per writev call (Linux's limit)
_STOP = object()
_SYNC_FILE_RANGE_WRITE = 2


# None where there is none (not Linux/glibc): the kernel writes back on its own schedule
_sync_file_range = libc_function("sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint])


def pwrite_all(fd: int, data: Any, offset: int) -> None:
    """Write all of ``data`` (any buffer) at ``offset`` of ``fd``: ``pwrite`` may write less than asked."""
    view = memoryview(data).cast("B")
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def start_writeback(fd: int, offset: int = 0, length: int = 0) -> None:
    """Ask the kernel to start writing ``length`` bytes from ``offset`` (0: to the end) of ``fd`` to
    disk, without waiting (Linux ``sync_file_range``). Durability still comes from fsync; this only
    starts the work early. Does nothing where unsupported."""
    if _sync_file_range is not None:
        _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)  # a failure only loses the head start


class HashingAppender:
    """Appends bytes to ``path`` (``mode`` "wb" or "ab") and keeps a SHA-256 of what it wrote."""

    def __init__(self, path: Path, mode: str = "wb", digest: Any = None, depth: int = 4, direct: bool = True) -> None:
        self.path = path
        self.digest = digest if digest is not None else hashlib.sha256()
        # a new file is written past the page cache where the file system allows (see direct_file)
        self._direct = DirectAppender.open(path) if direct and mode == "wb" else None
        self._file = open(path, mode, buffering=0) if self._direct is None else None
        self._pieces: list[bytes | memoryview] = []
        self._pending = 0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)  # blocks to hash
        self._writes: queue.Queue[Any] = queue.Queue(maxsize=2)  # hashed blocks to write
        self._error: BaseException | None = None
        self._threads = [threading.Thread(target=self._hash, name=f"hash {path.name}", daemon=True),
                         threading.Thread(target=self._write, name=f"append {path.name}", daemon=True)]
        for thread in self._threads:
            thread.start()

    def _hash(self) -> None:
        """Hash each block in order and pass it on to the writing thread (the two overlap)."""
        while True:
            block = self._queue.get()
            try:
                if block is _STOP:
                    self._writes.put(_STOP)
                    return
                if self._error is None:
                    pieces, size = block
                    if size >= LARGE_PIECES * len(pieces):
                        for piece in pieces:  # each large one hashed with the GIL released
                            self.digest.update(piece)
                    else:
                        pieces = [b"".join(pieces)]
                        self.digest.update(pieces[0])
                    self._writes.put((pieces, size))
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread, raised there
                self._error = exc
            finally:
                self._queue.task_done()

    def _write(self) -> None:
        while True:
            block = self._writes.get()
            try:
                if block is _STOP:
                    return
                if self._error is None and self._direct is not None:
                    for piece in block[0]:
                        self._direct.write(piece)
                elif self._error is None:
                    pieces, size = block
                    start = self._file.tell()
                    if len(pieces) == 1:
                        self._write_all(pieces[0])
                    else:
                        self._write_pieces(pieces)
                    start_writeback(self._file.fileno(), start, size)
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread, raised there
                self._error = exc
            finally:
                self._writes.task_done()

    def _write_all(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            view = view[self._file.write(view) :]  # a short write is retried with the rest

    def _write_pieces(self, pieces: list[bytes | memoryview]) -> None:
        """Write ``pieces`` in order with ``writev``, ``IOV_MAX`` at a time: no copy into one block."""
        fd = self._file.fileno()
        at = 0
        while at < len(pieces):
            written = os.writev(fd, pieces[at : at + IOV_MAX])
            if written == 0:  # nothing taken: a plain write of the next piece raises the error, if any
                self._write_all(pieces[at])
                at += 1
                continue
            while at < len(pieces) and written >= len(pieces[at]):
                written -= len(pieces[at])
                at += 1
            if written:  # a short write ended inside this piece: go on from there
                pieces[at] = memoryview(pieces[at])[written:]

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def write(self, data: bytes) -> None:
        """Append ``data`` (kept by reference: do not change it afterwards)."""
        self._pieces.append(data)
        self._pending += len(data)
        if self._pending >= BLOCK or len(self._pieces) >= MAX_PIECES:
            self._hand_over()

    def write_pair(self, first: bytes, second: bytes) -> None:
        """Append ``first`` then ``second`` (a record's header and payload), kept by reference."""
        self._pieces += (first, second)
        self._pending += len(first) + len(second)
        if self._pending >= BLOCK or len(self._pieces) >= MAX_PIECES:
            self._hand_over()

    def write_many(self, pieces: list[bytes], nbytes: int) -> None:
        """Append ``pieces`` (``nbytes`` in all) in order, kept by reference."""
        self._pieces += pieces
        self._pending += nbytes
        if self._pending >= BLOCK or len(self._pieces) >= MAX_PIECES:
            self._hand_over()

    def _hand_over(self) -> None:
        self._raise_error()
        self._queue.put((self._pieces, self._pending))
        self._pieces = []
        self._pending = 0

    def flush(self) -> None:
        """Wait until everything appended so far has reached the operating system."""
        if self._pieces:
            self._hand_over()
        self._queue.join()
        self._writes.join()
        self._raise_error()
        if self._direct is not None:
            self._direct.expose()

    def close(self) -> str:
        """Flush, stop the thread, close the file; return the SHA-256 (hex) of the whole file."""
        try:
            self.flush()
        finally:
            self._queue.put(_STOP)
            for thread in self._threads:
                thread.join()
            if self._direct is not None:
                self._direct.close()
            else:
                self._file.close()
        return self.digest.hexdigest()

    def abandon(self) -> None:
        """Stop without raising (after another error): what reached the file stays for --resume."""
        try:
            self.close()
        except OSError:
            pass
