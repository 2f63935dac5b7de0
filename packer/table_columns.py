"""A table's columns held in bounded memory: each column's converted values go into compact arrays
(no object per row), which move to one unnamed temporary file a megabyte at a time and are read
back one column at a time when the pack's fields are written."""

from __future__ import annotations

import ctypes
import functools
import os
import tempfile
from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np

from packload.core.libc import libc_function
from packload.packer.append_file import pwrite_all
from packload.packer.table_types import CONVERT, BadCell, missing, to_list, to_string

_DTYPES = {"int": np.int64, "float": np.float64, "bool": np.uint8, "string": np.uint8, "list[int]": np.int64,
           "list[float]": np.float64}
_FLUSH_BYTES = 1 << 20  # a column's values held in memory before they go to the spill file


class Spill:
    """Where the converted columns wait while the images are packed: one unnamed temporary file (in
    ``$TMPDIR``, removed when closed or when the process ends), so that a table's values cost no
    memory then. Each column is a list of segments ``(offset, bytes)`` of it."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile(prefix="packload-fields-", buffering=0)
        self.size = 0

    def write(self, data: Any) -> tuple[int, int]:
        """Append ``data`` (any buffer) to the file: the segment ``(offset, bytes)`` it now is."""
        view = memoryview(data).cast("B")
        at = self.size
        pwrite_all(self.file.fileno(), view, at)
        self.size += len(view)
        return at, len(view)

    def read(self, segments: list[tuple[int, int]], dtype: Any) -> np.ndarray:
        """``segments`` read back, one after the other, as one array of ``dtype``."""
        out = np.empty(sum(n for _, n in segments) // np.dtype(dtype).itemsize, dtype)
        buffer, at = memoryview(out).cast("B"), 0
        for offset, length in segments:
            done = 0
            while done < length:
                got = os.preadv(self.file.fileno(), [buffer[at + done : at + length]], offset + done)
                if got <= 0:
                    raise OSError(f"{self.file.name}: the spilled fields ended early")
                done += got
            at += length
        return out

    def close(self) -> None:
        """Remove the file (every column in it is gone)."""
        self.file.close()


@dataclass
class SpilledColumn:
    """A column whose arrays are in the spill file: read back (``values``, ``offsets``) each time
    they are asked for, so that ``core.fields.encode_fields`` holds one column at a time."""

    name: str
    type: str
    count: int
    spill: Spill
    value_segments: list[tuple[int, int]]
    end_segments: list[tuple[int, int]] | None

    def __len__(self) -> int:
        return self.count

    @property
    def values(self) -> np.ndarray:
        """Every row's value (scalars), or every row's values end to end (text bytes, lists)."""
        return self.spill.read(self.value_segments, _DTYPES[self.type])

    @property
    def offsets(self) -> np.ndarray | None:
        """Where each row's values start in ``values``, and the end (None for a scalar column)."""
        if self.end_segments is None:
            return None
        return np.concatenate([np.zeros(1, np.int64), self.spill.read(self.end_segments, np.int64)])


class ColumnBuilder:
    """One column's values as they are converted, in compact arrays (no object per row), moved to
    the spill file a megabyte at a time."""

    def __init__(self, name: str, kind: str, spill: Spill) -> None:
        self.name, self.kind, self.spill = name, kind, spill
        self._code = {"int": "q", "float": "d", "bool": "B", "list[int]": "q", "list[float]": "d"}.get(kind)
        self.values: Any = bytearray() if kind == "string" else array(self._code)
        self.ends = array("q") if kind in ("string", "list[int]", "list[float]") else None
        self.base = 0  # values already in the spill file
        self.count = 0
        self.value_segments: list[tuple[int, int]] = []
        self.end_segments: list[tuple[int, int]] = []

    def add(self, cell: Any) -> None:
        """This row's ``cell``, converted to the column's type; ``BadCell`` when it is not one."""
        kind = self.kind
        if missing(cell, kind):
            raise BadCell("is empty" if cell is not None else "is missing")
        if kind == "string":
            self.values += to_string(cell).encode("utf-8", "surrogatepass")
        elif self.ends is not None:
            self.values.extend(to_list(cell, kind))
        else:
            self.values.append(CONVERT[kind](cell))
        if self.ends is not None:
            self.ends.append(self.base + len(self.values))

    def blank(self) -> None:
        """A placeholder for a row that is not used (its arrays stay aligned with the rows)."""
        if self.ends is not None:
            self.ends.append(self.base + len(self.values))
        else:
            self.values.append(0)

    def undo(self) -> None:
        """Take back the value this row gave before another of its cells failed: a blank instead."""
        if self.ends is not None:
            self.ends.pop()
            start = (self.ends[-1] if self.ends else self._last_end) - self.base
            del self.values[start:]
            self.ends.append(self.base + len(self.values))
        else:
            self.values[-1] = 0

    _last_end = 0  # the end of the last row flushed (what a row's value starts from after a flush)

    def row_done(self) -> None:
        """A row is complete: move the values to the spill file once they pass ``_FLUSH_BYTES``."""
        self.count += 1
        if len(self.values) * (1 if self.kind in ("string", "bool") else 8) >= _FLUSH_BYTES or \
                (self.ends is not None and len(self.ends) * 8 >= _FLUSH_BYTES):
            self.flush()

    def flush(self) -> None:
        """Move the values and ends held in memory to the spill file."""
        if len(self.values):
            self.value_segments.append(self.spill.write(self.values))
            self.base += len(self.values)
            self.values = bytearray() if self.kind == "string" else array(self._code)
        if self.ends is not None and len(self.ends):
            self._last_end = self.ends[-1]
            self.end_segments.append(self.spill.write(self.ends))
            self.ends = array("q")

    def column(self) -> SpilledColumn:
        """The finished column (every row done), all of it in the spill file."""
        self.flush()
        return SpilledColumn(self.name, self.kind, self.count, self.spill, self.value_segments,
                             self.end_segments if self.ends is not None else None)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
HEAP_MMAP_THRESHOLD = 4 << 20


@functools.cache
def steady_heap() -> None:
    """Fix glibc's mmap threshold at 4 MiB for this process (glibc moves it between 128 KiB and
    32 MiB as blocks are freed). Packing from a table makes and frees arrays of a few megabytes per
    million rows; once the threshold has risen past them they are carved from the heap, whose freed
    middle is never given back, and the process keeps half again the memory it uses. Above the fixed
    threshold each such array is a mapping of its own, given back when freed, and a growing index
    is moved by ``mremap`` rather than copied."""
    mallopt = libc_function("mallopt", [ctypes.c_int, ctypes.c_int])
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD)
