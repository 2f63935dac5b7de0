"""Append to a file from a background thread, hashing as it goes: the caller's thread only collects
references to the bytes, and a writing thread joins each block of about 4 MiB, hashes it (SHA-256)
and writes it, both with the GIL released. One large hash call per block, rather than one per
record, keeps small records cheap. Memory stays bounded: at most ``depth`` blocks wait in the
queue. After each block the thread asks the kernel to start writing it to disk (``start_writeback``),
so the disk works while packing goes on and the final fsync has little left to wait for."""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import queue
import threading
from pathlib import Path
from typing import Any

BLOCK = 4 << 20
MAX_PIECES = 4096  # records per block at most, however small
_STOP = object()
_SYNC_FILE_RANGE_WRITE = 2


def _load_sync_file_range() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        function = libc.sync_file_range
    except (OSError, AttributeError):  # not Linux/glibc: the kernel writes back on its own schedule
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_sync_file_range = _load_sync_file_range()


def start_writeback(fd: int, offset: int = 0, length: int = 0) -> None:
    """Ask the kernel to start writing ``length`` bytes from ``offset`` (0: to the end) of ``fd`` to
    disk, without waiting (Linux ``sync_file_range``). Durability still comes from fsync; this only
    starts the work early. Does nothing where unsupported."""
    if _sync_file_range is not None:
        _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)  # a failure only loses the head start


class HashingAppender:
    """Appends bytes to ``path`` (``mode`` "wb" or "ab") and keeps a SHA-256 of what it wrote."""

    def __init__(self, path: Path, mode: str = "wb", digest: Any = None, depth: int = 4) -> None:
        self.path = path
        self.digest = digest if digest is not None else hashlib.sha256()
        self._file = open(path, mode, buffering=0)
        self._pieces: list[bytes | memoryview] = []
        self._pending = 0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"append {path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            block = self._queue.get()
            try:
                if block is _STOP:
                    return
                if self._error is None:
                    joined = b"".join(block)
                    self.digest.update(joined)
                    start = self._file.tell()
                    self._write_all(joined)
                    start_writeback(self._file.fileno(), start, len(joined))
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread, raised there
                self._error = exc
            finally:
                self._queue.task_done()

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self._file.write(view) :]  # a short write is retried with the rest

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

    def _hand_over(self) -> None:
        self._raise_error()
        self._queue.put(self._pieces)
        self._pieces = []
        self._pending = 0

    def flush(self) -> None:
        """Wait until everything appended so far has reached the operating system."""
        if self._pieces:
            self._hand_over()
        self._queue.join()
        self._raise_error()

    def close(self) -> str:
        """Flush, stop the thread, close the file; return the SHA-256 (hex) of the whole file."""
        try:
            self.flush()
        finally:
            self._queue.put(_STOP)
            self._thread.join()
            self._file.close()
        return self.digest.hexdigest()

    def abandon(self) -> None:
        """Stop without raising (after another error): what reached the file stays for --resume."""
        try:
            self.close()
        except OSError:
            pass
