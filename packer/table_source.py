"""A table of labels and fields beside a folder of images: ``pack ./images DEST --labels labels.csv``.

The table (CSV, TSV, JSON lines, or Parquet where pyarrow is installed) has one row per image: a
``path`` column (``--path-column``) relative to the source folder, and any other columns. A
``label`` column (``--label-column``) is the class: strings become indices into the sorted class
names (as ImageFolder's folder names do), integers (0 or more) are kept, the classes then being
``"0"`` to the largest. Every other column becomes a typed field of the pack (``core.fields``):
int, float, bool, string, list[int] or list[float], inferred from every row or given
(``--field age:int``).

The table is read twice, row by row, whatever its size: the first pass takes the paths (into one
bytes blob and a hash each, no object per row) and infers each column's type, the second converts
every cell into typed arrays. Nothing is guessed or dropped without a word: an image with no row is
left out (listed in ``ignored``), an image with a row that cannot be used (a cell that does not parse
as its column's type, a missing value, its path in two rows) is skipped (listed in ``skipped``, with
the row and the cell), and a row with no image, a duplicate path or a malformed row is listed in the
manifest's ``fields.rows_left_out``; ``strict`` makes the first of any of them an error.
"""

from __future__ import annotations

import csv
import ctypes
import functools
import hashlib
import io
import json
import os
import re
import tempfile
import time
import warnings
from array import array
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

import numpy as np

from packload.core.errors import SkippedFileError, UsageError
from packload.core.fields import MAX_COLUMNS, MAX_NAME_BYTES, fields_pieces, parse_type, part_name
from packload.core.format import FIELD_TYPES
from packload.core.libc import libc_function
from packload.core.manifest import SKIPPED_LISTED
from packload.core.remote import RemoteStore, is_url
from packload.core.samples import SampleList
from packload.core.scan import (
    ScanResult,
    TopListing,
    list_class,
    list_top,
    merge_listings,
    printable,
    scan_folder,
)
from packload.packer.append_file import pwrite_all
from packload.packer.remote_source import NO_IMAGES_HINT, list_class_keys, scan_url, source_name, url_errors

SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet",
            ".pq": "parquet"}
MAX_INT_LABEL = 999_999  # integer labels above this are refused: the classes would be "0" to it
_INT64 = (-(1 << 63), (1 << 63) - 1)
_INT_TEXT = re.compile(r"[+-]?\d+")
_FLOAT_TEXT = re.compile(r"[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|inf|infinity|nan)", re.IGNORECASE)
_LEADING_ZERO = re.compile(r"[+-]?0\d")
_BOOL_TEXT = {"true": True, "false": False, "1": True, "0": False}
_READ_BLOCK = 1 << 20
_MATCH_RUN = 65536  # samples matched with the table's rows at a time


@dataclass(frozen=True)
class TableOptions:
    """A table to pack beside the images (``pack --labels``): its file (or URL), the column of image
    paths, the class column (None: ``label`` when the table has one), and types given for columns
    (``{"age": "int"}``; the others are inferred)."""

    path: str
    path_column: str = "path"
    label_column: str | None = None
    types: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", os.fspath(self.path))
        object.__setattr__(self, "types", {name: parse_type(kind) for name, kind in dict(self.types).items()})

    @property
    def name(self) -> str:
        """The table's file name."""
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    def record(self) -> dict[str, Any]:
        """The options as the manifest and ``--resume`` note them (the table's digest added by the caller)."""
        return {"table": self.name, "path_column": self.path_column, "label_column": self.label_column,
                "types": dict(sorted(self.types.items()))}


def table_options(labels: str | os.PathLike[str] | TableOptions) -> TableOptions:
    """``labels`` as ``TableOptions`` (a path or URL: the defaults)."""
    return labels if isinstance(labels, TableOptions) else TableOptions(os.fspath(labels))


def parse_field_spec(text: str) -> tuple[str, str]:
    """``age:int`` → ``("age", "int")`` (``--field``); ``ValueError`` naming the form otherwise."""
    name, sep, kind = text.rpartition(":")
    if not sep or not name:
        raise ValueError(f"--field {text!r}: write NAME:TYPE, for example age:int (types: {', '.join(FIELD_TYPES)})")
    try:
        return name, parse_type(kind)
    except ValueError as exc:
        raise ValueError(f"--field {text!r}: {exc}") from None


# -- reading rows ----------------------------------------------------------------------------------
class _Hashing(io.RawIOBase):
    """A binary stream that hashes what is read through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw, self.digest = raw, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.raw.read(len(buffer))
        buffer[: len(data)] = data
        self.digest.update(data)
        return len(data)


class _Bad(Exception):
    """A row or a cell that cannot be used, and why."""


class TableReader:
    """The rows of one table file, read as many times as needed, its columns known after ``open``."""

    def __init__(self, options: TableOptions, storage_options: dict[str, Any] | None = None) -> None:
        self.options, self.storage_options = options, storage_options
        self.shown = options.path
        suffix = PurePosixPath(options.path.split("?", 1)[0]).suffix.lower()
        if suffix not in SUFFIXES:
            raise UsageError(f"{self.shown}: not a table packload reads; give a .csv, .tsv, .jsonl or .parquet file")
        self.kind = SUFFIXES[suffix]
        if self.kind == "parquet":
            try:
                import pyarrow.parquet  # noqa: F401
            except ImportError:
                raise UsageError(f"{self.shown}: a Parquet table needs pyarrow, which is not installed; "
                                 'pip install "packload[parquet]", or give the table as CSV or JSON lines') from None
        self.columns: list[str] = []
        self.sha256 = ""

    def _open(self) -> IO[bytes]:
        try:
            if is_url(self.options.path):
                import fsspec

                return fsspec.open(self.options.path, "rb", **(self.storage_options or {})).open()
            if Path(self.options.path).is_dir():
                raise UsageError(f"{self.shown}: is a folder; give the table file (labels.csv)")
            return open(self.options.path, "rb")
        except FileNotFoundError:
            raise UsageError(f"{self.shown}: table not found; give the file of labels (--labels labels.csv)") from None
        except PermissionError:
            raise UsageError(f"{self.shown}: cannot read the table; check its permissions") from None

    def header(self) -> list[str]:
        """The columns a CSV, TSV or Parquet table names before its rows (read without the rows)."""
        if self.kind == "parquet":
            import pyarrow.parquet as pq

            with self._open() as raw:
                try:
                    self._set_columns(list(pq.ParquetFile(raw).schema_arrow.names))
                except UsageError:
                    raise
                except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a file that is not Parquet
                    raise UsageError(f"{self.shown}: not a Parquet file ({type(exc).__name__}); give a .parquet "
                                     "table, or the table as CSV") from None
            return self.columns
        with self._open() as raw:
            for _ in self._csv_rows(_Hashing(raw)):
                break  # the header is read before the first row
        return self.columns

    def rows(self) -> Iterator[tuple[int, dict[str, Any] | str]]:
        """``(row number, cells or the reason the row cannot be read)`` for every row (numbered from
        1, the header not counted; blank lines are not rows). ``columns`` and ``sha256`` are set as
        the file is read (the digest when the last row has been given)."""
        with self._open() as raw:
            hashing = _Hashing(raw)
            if self.kind in ("csv", "tsv"):
                yield from self._csv_rows(hashing)
            elif self.kind == "jsonl":
                yield from self._jsonl_rows(hashing)
            else:
                yield from self._parquet_rows(raw)
                raw.seek(0)
            while hashing.read(_READ_BLOCK):  # what the reader left unread (a trailing blank line)
                pass
            self.sha256 = hashing.digest.hexdigest()

    def _csv_rows(self, stream: io.RawIOBase) -> Iterator[tuple[int, dict[str, Any] | str]]:
        text = io.TextIOWrapper(io.BufferedReader(stream, _READ_BLOCK), encoding="utf-8-sig", newline="")
        reader = csv.reader(text, delimiter="\t" if self.kind == "tsv" else ",")
        try:
            header = next(reader, None)
            if header is None:
                raise UsageError(f"{self.shown}: empty; give a table whose first row names its columns (path,label,...)")
            self._set_columns([name.strip() for name in header])
            width = len(self.columns)
            number = 0
            for cells in reader:
                if not cells:
                    continue  # a blank line
                number += 1
                if len(cells) != width:
                    yield number, f"has {len(cells)} cells, the header names {width} columns"
                    continue
                yield number, dict(zip(self.columns, cells, strict=True))
        except UnicodeDecodeError:
            raise UsageError(f"{self.shown}: not UTF-8 text (near line {reader.line_num + 1}); save the table as "
                             "UTF-8") from None
        except csv.Error as exc:
            raise UsageError(f"{self.shown}, line {reader.line_num}: {exc}; fix the table") from None

    def _jsonl_rows(self, stream: io.RawIOBase) -> Iterator[tuple[int, dict[str, Any] | str]]:
        seen: dict[str, None] = dict.fromkeys(self.columns)
        number = 0
        for line_number, line in enumerate(io.BufferedReader(stream, _READ_BLOCK), 1):
            if not line.strip():
                continue
            number += 1
            try:
                row = json.loads(line)
            except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
                yield number, f"line {line_number} is not valid JSON ({str(exc).split(':')[0]})"
                continue
            if not isinstance(row, dict):
                yield number, f"line {line_number} is not a JSON object"
                continue
            for name in row:
                if name not in seen:
                    seen[name] = None
                    self._set_columns(list(seen))
            yield number, row
        if not number and not self.columns:
            raise UsageError(f"{self.shown}: no rows; give a table of one JSON object per line")

    def _parquet_rows(self, raw: IO[bytes]) -> Iterator[tuple[int, dict[str, Any] | str]]:
        import pyarrow.parquet as pq

        try:
            table = pq.ParquetFile(raw)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a file that is not Parquet
            raise UsageError(f"{self.shown}: not a Parquet file ({type(exc).__name__}); give a .parquet table, "
                             "or the table as CSV") from None
        self._set_columns(list(table.schema_arrow.names))
        number = 0
        for batch in table.iter_batches(batch_size=65536):
            for row in batch.to_pylist():
                number += 1
                yield number, row

    def _set_columns(self, names: list[str]) -> None:
        for k, name in enumerate(names):
            if not name:
                raise UsageError(f"{self.shown}: column {k + 1} has no name; name every column in the header")
            if len(name.encode("utf-8")) > MAX_NAME_BYTES:
                raise UsageError(f"{self.shown}: column name {name[:40]!r}... is longer than {MAX_NAME_BYTES} bytes; "
                                 "shorten it")
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise UsageError(f"{self.shown}: two columns named {duplicates[0]!r}; give each column its own name")
        if len(names) > MAX_COLUMNS:
            raise UsageError(f"{self.shown}: {len(names)} columns, more than the {MAX_COLUMNS} a pack may hold")
        self.columns = names


# -- cells -----------------------------------------------------------------------------------------
def _kind(cell: Any) -> str | None:
    """What a cell looks like, for inferring its column's type: bool, int, float, list[int],
    list[float], list (another list), or text; None for an empty cell (not counted)."""
    if cell is None:
        return None
    if isinstance(cell, str):
        text = cell.strip()
        if not text:
            return None if not cell else "text"
        low = text.lower()
        if low in ("true", "false"):
            return "bool"
        if _INT_TEXT.fullmatch(text):  # a leading zero ("007": an id, a code) is kept as text
            return "int" if _INT64[0] <= int(text) <= _INT64[1] and not _LEADING_ZERO.match(text) else "text"
        if _FLOAT_TEXT.fullmatch(text):
            return "float" if not _LEADING_ZERO.match(text) else "text"
        if text.startswith("["):
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                return "text"
            return _kind(value) if isinstance(value, list) else "text"
        return "text"
    if isinstance(cell, bool):
        return "bool"
    if isinstance(cell, int):
        return "int" if _INT64[0] <= cell <= _INT64[1] else "text"
    if isinstance(cell, float):
        return "float"
    if isinstance(cell, list):
        kinds = {_scalar_kind(v) for v in cell}
        if kinds <= {"int"}:
            return "list[int]"
        return "list[float]" if kinds <= {"int", "float"} else "list"
    return "text"


def _scalar_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "other"
    if isinstance(value, int):
        return "int" if _INT64[0] <= value <= _INT64[1] else "other"
    return "float" if isinstance(value, float) else "other"


def _inferred(kinds: set[str]) -> str:
    """The narrowest type every kind of cell seen fits."""
    for kind, fits in (("bool", {"bool"}), ("int", {"int"}), ("float", {"int", "float"}),
                       ("list[int]", {"list[int]"}), ("list[float]", {"list[int]", "list[float]"})):
        if kinds and kinds <= fits:
            return kind
    return "string"


def _shown(cell: Any) -> str:
    text = cell if isinstance(cell, str) else json.dumps(cell)
    return repr(printable(text[:60] + ("..." if len(text) > 60 else "")))


def to_int(cell: Any) -> int:
    if isinstance(cell, str) and _INT_TEXT.fullmatch(cell.strip()):
        value = int(cell.strip())
    elif isinstance(cell, int) and not isinstance(cell, bool):
        value = cell
    else:
        raise _Bad(f"{_shown(cell)} is not an integer")
    if not _INT64[0] <= value <= _INT64[1]:
        raise _Bad(f"{_shown(cell)} does not fit a 64-bit integer")
    return value


def to_float(cell: Any) -> float:
    if isinstance(cell, str) and _FLOAT_TEXT.fullmatch(cell.strip()):
        return float(cell.strip())
    if isinstance(cell, (int, float)) and not isinstance(cell, bool):
        return float(cell)
    raise _Bad(f"{_shown(cell)} is not a number")


def to_bool(cell: Any) -> bool:
    if isinstance(cell, bool):
        return cell
    if isinstance(cell, str) and cell.strip().lower() in _BOOL_TEXT:
        return _BOOL_TEXT[cell.strip().lower()]
    if isinstance(cell, int) and cell in (0, 1):
        return bool(cell)
    raise _Bad(f"{_shown(cell)} is not true, false, 1 or 0")


def to_string(cell: Any) -> str:
    if isinstance(cell, str):
        return cell
    if isinstance(cell, (int, float)) and not isinstance(cell, bool):
        return json.dumps(cell)
    raise _Bad(f"{_shown(cell)} is not text")


def to_list(cell: Any, kind: str) -> list[Any]:
    value = cell
    if isinstance(cell, str):
        try:
            value = json.loads(cell)
        except (ValueError, RecursionError):
            raise _Bad(f"{_shown(cell)} is not a JSON list") from None
    if not isinstance(value, list):
        raise _Bad(f"{_shown(cell)} is not a list")
    scalar = to_int if kind == "list[int]" else to_float
    try:
        return [scalar(v) if not isinstance(v, str) else _no_text(v) for v in value]
    except _Bad:
        raise _Bad(f"{_shown(cell)} is not a list of {'integers' if kind == 'list[int]' else 'numbers'}") from None


def _no_text(value: str) -> Any:
    raise _Bad(value)


_CONVERT = {"int": to_int, "float": to_float, "bool": to_bool, "string": to_string}


def _missing(cell: Any, kind: str) -> bool:
    """An empty cell: a missing value, except in a string column of a CSV (an empty string)."""
    return cell is None or (isinstance(cell, str) and not cell and kind != "string")


_DTYPES = {"int": np.int64, "float": np.float64, "bool": np.uint8, "string": np.uint8, "list[int]": np.int64,
           "list[float]": np.float64}
_FLUSH_BYTES = 1 << 20  # a column's values held in memory before they go to the spill file


class _Spill:
    """Where the converted columns wait while the images are packed: one unnamed temporary file (in
    ``$TMPDIR``, removed when closed or when the process ends), so that a table's values cost no
    memory then. Each column is a list of segments ``(offset, bytes)`` of it."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile(prefix="packload-fields-", buffering=0)
        self.size = 0

    def write(self, data: Any) -> tuple[int, int]:
        view = memoryview(data).cast("B")
        at = self.size
        pwrite_all(self.file.fileno(), view, at)
        self.size += len(view)
        return at, len(view)

    def read(self, segments: list[tuple[int, int]], dtype: Any) -> np.ndarray:
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
        self.file.close()


@dataclass
class SpilledColumn:
    """A column whose arrays are in the spill file: read back (``values``, ``offsets``) each time
    they are asked for, so that ``core.fields.encode_fields`` holds one column at a time."""

    name: str
    type: str
    count: int
    spill: _Spill
    value_segments: list[tuple[int, int]]
    end_segments: list[tuple[int, int]] | None

    def __len__(self) -> int:
        return self.count

    @property
    def values(self) -> np.ndarray:
        return self.spill.read(self.value_segments, _DTYPES[self.type])

    @property
    def offsets(self) -> np.ndarray | None:
        if self.end_segments is None:
            return None
        return np.concatenate([np.zeros(1, np.int64), self.spill.read(self.end_segments, np.int64)])


class _Builder:
    """One column's values as they are converted, in compact arrays (no object per row), moved to
    the spill file a megabyte at a time."""

    def __init__(self, name: str, kind: str, spill: _Spill) -> None:
        self.name, self.kind, self.spill = name, kind, spill
        self._code = {"int": "q", "float": "d", "bool": "B", "list[int]": "q", "list[float]": "d"}.get(kind)
        self.values: Any = bytearray() if kind == "string" else array(self._code)
        self.ends = array("q") if kind in ("string", "list[int]", "list[float]") else None
        self.base = 0  # values already in the spill file
        self.count = 0
        self.value_segments: list[tuple[int, int]] = []
        self.end_segments: list[tuple[int, int]] = []

    def add(self, cell: Any) -> None:
        kind = self.kind
        if _missing(cell, kind):
            raise _Bad("is empty" if cell is not None else "is missing")
        if kind == "string":
            self.values += to_string(cell).encode("utf-8", "surrogatepass")
        elif self.ends is not None:
            self.values.extend(to_list(cell, kind))
        else:
            self.values.append(_CONVERT[kind](cell))
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
        if len(self.values):
            self.value_segments.append(self.spill.write(self.values))
            self.base += len(self.values)
            self.values = bytearray() if self.kind == "string" else array(self._code)
        if self.ends is not None and len(self.ends):
            self._last_end = self.ends[-1]
            self.end_segments.append(self.spill.write(self.ends))
            self.ends = array("q")

    def column(self) -> SpilledColumn:
        self.flush()
        return SpilledColumn(self.name, self.kind, self.count, self.spill, self.value_segments,
                             self.end_segments if self.ends is not None else None)


# -- the table ---------------------------------------------------------------------------------------
@dataclass
class _Inference:
    kinds: set[str] = field(default_factory=set)
    numbers: int = 0
    others: int = 0
    example: tuple[int, Any] | None = None

    def see(self, number: int, cell: Any) -> None:
        kind = _kind(cell)
        if kind is None:
            return
        self.kinds.add(kind)
        if kind in ("int", "float"):
            self.numbers += 1
        else:
            self.others += 1
            if self.example is None:
                self.example = (number, cell)


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


class Table:
    """A table read and typed: its rows' paths (one blob), its columns as arrays by row, and every
    row that cannot be used with the reason."""

    def __init__(self, options: TableOptions, storage_options: dict[str, Any] | None = None) -> None:
        steady_heap()
        self.options = options
        self.reader = TableReader(options, storage_options)
        self.problems: dict[int, str] = {}  # row index (from 0) -> why it cannot be used
        self.label_column: str | None = None
        self.label_type: str | None = None
        self.types: dict[str, str] = {}
        self.rows = -1  # until the paths are read
        if self.reader.kind == "jsonl":  # its columns are every key of every row
            self.read_paths()
        else:  # the columns are in the header: the paths are read once the images are listed (less memory)
            self._decide_columns(self.reader.header())

    def read_paths(self) -> None:
        """Pass 1 (once): every row's path, and every column's type."""
        if self.rows < 0:
            self._read_paths()

    @property
    def shown(self) -> str:
        return self.reader.shown

    def _read_paths(self) -> None:
        """Pass 1: every row's path (normalised) and every column's inferred type."""
        blob, ends = bytearray(), array("q")
        inference: dict[str, _Inference] = {}
        path_column = self.options.path_column
        for number, row in self.reader.rows():
            index = number - 1
            path = ""
            if isinstance(row, str):
                self.problems[index] = row
            elif path_column not in row and self.reader.kind != "jsonl":
                break  # the header has no path column: said below, once
            else:
                try:
                    path = _path_of(row.get(path_column))
                except _Bad as exc:
                    self.problems[index] = f"path {exc}"
                for name, cell in row.items():
                    if name != path_column:
                        (inference.get(name) or inference.setdefault(name, _Inference())).see(number, cell)
            blob += path.encode("utf-8", "surrogatepass")
            ends.append(len(blob))
        columns = self.reader.columns
        self.rows = len(ends)
        self.sha256 = self.reader.sha256
        self.paths = bytes(blob)
        del blob
        self.path_ends = np.frombuffer(ends, np.int64) if len(ends) else np.zeros(0, np.int64)
        self._decide_columns(columns)
        self._decide_types(columns, inference)

    def _decide_columns(self, columns: list[str]) -> None:
        """Check the columns the options name, and settle the class column."""
        given, path_column = dict(self.options.types), self.options.path_column
        if path_column not in columns:
            raise UsageError(f"{self.shown}: no column {path_column!r} (its columns: {', '.join(columns[:12])}); name "
                             "the column of image paths with --path-column")
        unknown = [name for name in given if name not in columns]
        if unknown:
            raise UsageError(f"--field {unknown[0]}:{given[unknown[0]]}: {self.shown} has no column {unknown[0]!r} "
                             f"(its columns: {', '.join(columns[:12])})")
        if path_column in given:
            raise UsageError(f"--field {path_column}:{given[path_column]}: {path_column!r} is the column of image paths, "
                             "not a field")
        label = self.options.label_column
        if label is not None and label not in columns:
            raise UsageError(f"--label-column {label}: {self.shown} has no column {label!r} (its columns: "
                             f"{', '.join(columns[:12])})")
        if label is None and "label" in columns:
            label = "label"
        if label is not None and label != "label" and "label" in columns:
            raise UsageError(f"{self.shown}: a column is named 'label' but --label-column is {label!r}; 'label' "
                             "names the class when reading a pack: rename that column")
        if label == path_column:
            raise UsageError(f"--label-column {label}: that is the column of image paths; name the class column")
        if label is not None and label in given and given[label] not in ("int", "string"):
            raise UsageError(f"--field {label}:{given[label]}: the class column {label!r} holds integers or names "
                             "(int or string)")
        self.label_column = label

    def _decide_types(self, columns: list[str], inference: dict[str, _Inference]) -> None:
        """Each column's type: given, or inferred from every cell seen (``inference``)."""
        given, path_column, label = dict(self.options.types), self.options.path_column, self.label_column
        for name in columns:
            if name == path_column:
                continue
            seen = inference.get(name, _Inference())
            kind = given.get(name) or _inferred(seen.kinds)
            if name == label:
                self.label_type = kind if name in given else ("int" if seen.kinds <= {"int"} and seen.kinds
                                                              else "string")
                continue
            if name not in given and kind == "string" and seen.example and seen.others <= max(1, seen.numbers // 100):
                number, cell = seen.example  # a column of numbers but for a few cells: said, not guessed
                some = f"{seen.others:,} of its cells is not a number" if seen.others == 1 else \
                    f"{seen.others:,} of its cells are not numbers"
                warnings.warn(f"{self.shown}: column {name!r} is stored as text: {some} (row {number}: {_shown(cell)}); "
                              f"give --field {name}:int (or float) to store numbers and leave those rows out",
                              UserWarning, stacklevel=4)
            self.types[name] = kind

    def release(self) -> None:
        """Let go of the paths once the table is joined (the fields hold what the pack needs)."""
        self.paths, self.path_ends = b"", np.zeros(0, np.int64)

    def path(self, row: int) -> str:
        """The path in row ``row`` (from 0), as the table gives it."""
        start = int(self.path_ends[row - 1]) if row else 0
        return self.paths[start : int(self.path_ends[row])].decode("utf-8", "surrogatepass")

    def path_bytes(self, row: int) -> bytes:
        start = int(self.path_ends[row - 1]) if row else 0
        return self.paths[start : int(self.path_ends[row])]

    def convert(self) -> tuple[list[SpilledColumn], np.ndarray | None, list[str]]:
        """Pass 2: every column as typed arrays by row, and the class of every row (codes: for a
        string label, indices into the names returned, in the order first seen). A row with a cell
        that does not parse, or a missing value, is noted in ``problems``."""
        self.spill = _Spill()
        builders = [_Builder(name, kind, self.spill) for name, kind in self.types.items()]
        label_codes = array("i")
        names: dict[str, int] = {}
        label = self.label_column
        before = self.sha256
        for number, row in self.reader.rows():
            index = number - 1
            if index >= self.rows:
                raise UsageError(f"{self.shown}: changed while it was being read; pack again once it is written")
            if index in self.problems or isinstance(row, str):
                for builder in builders:
                    builder.blank()
                    builder.row_done()
                label_codes.append(-1)
                continue
            done = 0
            try:
                code = -1
                if label is not None:
                    code = self._label_code(row.get(label), names)
                for builder in builders:
                    try:
                        builder.add(row.get(builder.name))
                    except _Bad as exc:
                        raise _Bad(f"column {builder.name!r} ({builder.kind}): {exc}") from None
                    done += 1
                label_codes.append(code)
            except _Bad as exc:
                self.problems[index] = f"{self.options.name} row {number}: {exc}"  # no folder: a manifest says it
                for builder in builders[done:]:
                    builder.blank()
                for builder in builders[:done]:
                    builder.undo()
                label_codes.append(-1)
            for builder in builders:
                builder.row_done()
        if self.reader.sha256 != before:
            raise UsageError(f"{self.shown}: changed while it was being read; pack again once it is written")
        codes = np.frombuffer(label_codes, np.int32).copy() if label is not None and len(label_codes) else None
        return [builder.column() for builder in builders], codes, sorted(names, key=names.__getitem__)

    def _label_code(self, cell: Any, names: dict[str, int]) -> int:
        label = self.label_column
        if _missing(cell, "int") or (isinstance(cell, str) and not cell.strip()):
            raise _Bad(f"column {label!r} (the class): {'is empty' if cell is not None else 'is missing'}")
        if self.label_type == "int":
            try:
                value = to_int(cell)
            except _Bad as exc:
                raise _Bad(f"column {label!r} (the class, int): {exc}") from None
            if not 0 <= value <= MAX_INT_LABEL:
                raise _Bad(f"column {label!r} (the class, int): {value} is not in 0..{MAX_INT_LABEL}; give "
                           f"--field {label}:string to keep it as a class name")
            return value
        try:
            name = to_string(cell)
        except _Bad as exc:
            raise _Bad(f"column {label!r} (the class): {exc}") from None
        return names.setdefault(name, len(names))


def _path_of(cell: Any) -> str:
    """The path a row gives, relative to the source folder (a leading ``./`` dropped)."""
    if not isinstance(cell, str):
        raise _Bad("is missing" if cell is None else f"{_shown(cell)} is not text")
    path = cell
    while path.startswith("./"):
        path = path[2:]
    if not path:
        raise _Bad("is empty")
    return path


# -- joining the table with the images -------------------------------------------------------------
@dataclass
class TableFields:
    """What a table adds to a scan: each sample's row, the fields by row, and what was left out.

    ``skips`` are the images skipped for their row: ``(insert, path, reason)``, ``insert`` being the
    number of packed samples before them in scan order (so they interleave with the files skipped
    while packing)."""

    options: TableOptions
    sha256: str
    rows: int
    row_of: np.ndarray
    columns: list[SpilledColumn]
    label_column: str | None
    label_type: str | None
    skips: list[tuple[int, str, str]]
    rows_left_out: list[dict[str, Any]]
    rows_left_out_count: int

    def options_record(self) -> dict[str, Any]:
        """The table's entry in the pack's ``options`` (compared by ``--resume``)."""
        return {**self.options.record(), "label_column": self.label_column, "sha256": self.sha256}

    def with_skips(self, skipped: list[dict[str, Any]], files: int) -> tuple[list[dict[str, Any]], int]:
        """The manifest's ``skipped`` (the files skipped while packing, ``pos`` in scan order, and the
        images skipped for their row, in one scan order) and the count of image files found."""
        if not self.skips:
            return skipped, files
        merged = [((s["pos"], 1), s) for s in skipped]
        merged += [((at, 0), {"path": path, "reason": reason}) for at, path, reason in self.skips]
        merged.sort(key=lambda pair: pair[0])
        return [item for _, item in merged], files + len(self.skips)

    def part(self, skipped: list[dict[str, Any]], packed: int, backend: str,
             write: Callable[[Any], Any]) -> dict[str, Any]:
        """Hand ``write`` the fields part of the records written (every sample but the ``skipped``
        ones, ``pos`` in scan order, of ``packed`` samples), piece by piece, and return the manifest's
        ``fields`` entry for it. One column is in memory at a time, and only while it is written."""
        keep = np.ones(packed, bool)
        keep[[s["pos"] for s in skipped if "pos" in s]] = False
        rows = self.row_of[keep]
        columns, self.columns = self.columns, []
        spills = {id(c.spill): c.spill for c in columns if isinstance(c, SpilledColumn)}
        digest, size = hashlib.sha256(), 0
        try:
            for piece in fields_pieces(columns, rows, release=True):  # type: ignore[arg-type]
                digest.update(piece)
                size += len(piece)
                write(piece)
        finally:
            for spill in spills.values():
                spill.close()
        return {
            "name": part_name(backend), "size": size, "sha256": digest.hexdigest(),
            "columns": [{"name": c["name"], "type": c["type"]} for c in self.listed],
            "table": {"name": self.options.name, "rows": self.rows, "sha256": self.sha256},
            "path_column": self.options.path_column, "label_column": self.label_column,
            "label_type": self.label_type,
            "rows_left_out": self.rows_left_out[:SKIPPED_LISTED], "rows_left_out_count": self.rows_left_out_count,
        }

    listed: list[dict[str, str]] = field(default_factory=list)


class TableScan(ScanResult):
    """A scan of the images a table names: the samples that have a usable row (labelled by the
    table's class column when it has one), and the table's fields (``table``)."""

    table: TableFields

    def check_layout(self, strict: bool) -> None:
        """A table names its own layout: only classes taken from folders are looked at (splits)."""
        if self.table.label_column is None:
            self.check_splits(strict)


def scan_for(src: str | os.PathLike[str], table: Table, storage_options: dict[str, Any] | None = None) -> ScanResult:
    """The scan a table is joined with: with a class column, every image anywhere below ``src``
    (the class comes from the table); without, ``scan_folder``'s (classes from folders, if any).
    ``src`` may be a URL (``scan_url``'s rules)."""
    if is_url(src):
        url = str(src).rstrip("/")
        if table.label_column is None:
            return scan_url(url, storage_options)
        store = RemoteStore(url, storage_options)
        store.check_bucket()
        keys = sorted(store.listing_all())
        with url_errors(url):
            return merge_listings(TopListing(Path(source_name(url)), [], [], []), [list_class_keys(keys)],
                                  NO_IMAGES_HINT)
    if table.label_column is None:
        return scan_folder(src)
    top = list_top(src)
    return merge_listings(top._replace(classes=[], outside=[]), [list_class(top.root, "")])


def table_or_none(labels: str | os.PathLike[str] | TableOptions | None,
                  storage_options: dict[str, Any] | None = None) -> Table | None:
    """The table ``labels`` names, its paths read and its types decided; None without one."""
    return None if labels is None else Table(table_options(labels), storage_options)


def ray_scan(in_tasks: Callable[[], tuple[ScanResult, dict[str, Any]]], src: str | os.PathLike[str],
             table: Table | None, strict: bool, storage_options: dict[str, Any] | None = None
             ) -> tuple[ScanResult, dict[str, Any]]:
    """The Ray engine's scan, with where it ran: ``in_tasks()`` (classes listed in Ray tasks), or, for
    a table with a class column, every image below ``src`` listed by the driver; joined with the
    table when there is one."""
    if table is None or table.label_column is None:
        scan, where = in_tasks()
    else:
        started = time.perf_counter()
        scan = scan_for(src, table, storage_options)
        where = {"scan_tasks": 0, "scan_tasks_per_node": {}, "scan_s": round(time.perf_counter() - started, 3)}
    return (scan if table is None else join(scan, table, strict)), where


def join(scan: ScanResult, table: Table, strict: bool) -> TableScan:
    """``scan`` narrowed to the images with a usable row of ``table`` (pass 2 runs here), with the
    table's classes when it has a class column. ``strict``: the first problem is an error."""
    samples = scan.samples if isinstance(scan.samples, SampleList) else SampleList.of(scan.samples)
    table.read_paths()
    row_of, duplicates = _match(samples, table)
    columns, codes, names = table.convert()
    problems, shown, name = table.problems, table.shown, table.options.name
    bad = np.zeros(table.rows, bool)  # rows that cannot be used
    bad[list(problems)] = True
    bad[list(duplicates)] = True
    has_row = row_of >= 0
    keep = has_row.copy()
    keep[has_row] = ~bad[row_of[has_row]]
    skips: list[tuple[int, str, str]] = []
    kept_before = np.cumsum(keep, dtype=np.int32 if len(keep) < 1 << 31 else np.int64)  # packed up to each
    for pos in np.flatnonzero(has_row & ~keep).tolist():
        row = int(row_of[pos])
        reason = (f"{name}: rows {', '.join(str(r + 1) for r in duplicates[row][:5])} all give this path; keep one"
                  if row in duplicates else problems[row])
        skips.append((int(kept_before[pos]), samples.path(pos), reason))  # kept_before: not itself kept
    del kept_before
    no_row = [{"path": samples.path(pos), "reason": f"image with no row in {table.options.name}"}
              for pos in np.flatnonzero(~has_row).tolist()]
    used = np.zeros(table.rows, bool)
    used[row_of[has_row]] = True
    left_rows = np.flatnonzero(bad | ~used)
    reasons = {item["path"]: item["reason"] for item in scan.ignored} if len(left_rows) else {}
    left_out: list[dict[str, Any]] = []
    for row in left_rows[:SKIPPED_LISTED].tolist():
        path = table.path(row)
        if row in duplicates:
            reason = f"its path is in row {', '.join(str(r + 1) for r in duplicates[row] if r != row)} too"
        elif row in problems:
            reason = problems[row].removeprefix(f"{name} row {row + 1}: ")
        else:
            why = reasons.get(path)
            reason = "no image at this path in the source" + (f" (left out: {why})" if why else "")
        left_out.append({"row": row + 1, "path": printable(path), "reason": reason})
    if strict:
        _refuse(table, left_out, skips, no_row)
    positions = np.flatnonzero(keep)
    rows = row_of[positions]
    classes, labels = list(scan.classes), None
    if table.label_column is not None and codes is not None:
        classes, labels = _classes(table, codes, rows, names)
    if not len(positions):
        first = (left_out[:1] or [{"row": "-", "path": "", "reason": "no rows"}])[0]
        raise UsageError(f"{scan.root}: no image has a usable row in {shown} (first problem: row {first['row']}, "
                         f"{first['path']}: {first['reason']})")
    result = TableScan(root=scan.root, classes=classes, samples=samples.take(positions, labels),
                       ignored=sorted(scan.ignored + no_row, key=lambda item: item["path"]))
    result.table = TableFields(table.options, table.sha256, table.rows, rows.astype(np.int32 if table.rows < 1 << 31 else np.int64), columns,
                               table.label_column, table.label_type, skips, left_out, len(left_rows),
                               listed=[{"name": c.name, "type": c.type} for c in columns])
    table.release()
    return result


def _match(samples: SampleList, table: Table) -> tuple[np.ndarray, dict[int, list[int]]]:
    """Each sample's row in ``table`` (-1: none), and the rows whose path is in other rows too
    (row → every row of that path). Joined on 64-bit hashes of the paths, every match confirmed
    on the bytes: no dictionary of a million strings."""
    hashes = _row_hashes(table)
    usable = np.flatnonzero(hashes != 0)
    order = usable[np.argsort(hashes[usable], kind="stable")]
    sorted_hashes = hashes[order]
    del hashes, usable
    duplicates: dict[int, list[int]] = {}
    same = np.flatnonzero(sorted_hashes[1:] == sorted_hashes[:-1])
    for k in same.tolist():  # rows with one hash: group those whose paths are equal
        a, b = int(order[k]), int(order[k + 1])
        if table.path_bytes(a) == table.path_bytes(b):
            group = duplicates.setdefault(a, [a])
            if b not in group:
                group.append(b)
            duplicates[b] = group
    for group in {id(g): g for g in duplicates.values()}.values():
        group.sort()
    row_of = np.full(len(samples), -1, np.int64)
    blob, ends = samples.blob, samples.ends
    for first in range(0, len(samples), _MATCH_RUN):  # a run of samples at a time: no list of them all
        last = min(first + _MATCH_RUN, len(samples))
        bounds = ends[max(first - 1, 0) : last].tolist()
        if not first:
            bounds.insert(0, 0)
        paths = [blob[bounds[k] : bounds[k + 1]] for k in range(last - first)]
        hashes = np.fromiter(map(hash, paths), np.int64, len(paths))
        at = np.minimum(np.searchsorted(sorted_hashes, hashes), max(len(sorted_hashes) - 1, 0))
        hit = sorted_hashes[at] == hashes if len(sorted_hashes) else np.zeros(len(paths), bool)
        for k in np.flatnonzero(hit).tolist():
            j = int(at[k])
            while j < len(sorted_hashes) and sorted_hashes[j] == hashes[k]:
                if table.path_bytes(int(order[j])) == paths[k]:
                    row_of[first + k] = int(order[j])
                    break
                j += 1
    return row_of, duplicates


def _row_hashes(table: Table) -> np.ndarray:
    """A 64-bit hash of each row's path (0 for a row without one), a run of rows at a time."""
    out = np.zeros(table.rows, np.int64)
    blob, ends = table.paths, table.path_ends
    for first in range(0, table.rows, _MATCH_RUN):
        last = min(first + _MATCH_RUN, table.rows)
        bounds = ends[max(first - 1, 0) : last].tolist()
        if not first:
            bounds.insert(0, 0)
        out[first:last] = np.fromiter((hash(blob[bounds[k] : bounds[k + 1]]) if bounds[k + 1] > bounds[k] else 0
                                       for k in range(last - first)), np.int64, last - first)
    return out


def _classes(table: Table, codes: np.ndarray, rows: np.ndarray, names: list[str]) -> tuple[list[str], np.ndarray]:
    """The class names and each packed sample's class index, from the rows' class cells: integers
    kept (classes ``"0"`` to the largest), names mapped to their place among the sorted names that
    the packed rows give (as ImageFolder sorts its folders)."""
    used = codes[rows]
    if table.label_type == "int":
        top = int(used.max()) if len(used) else -1
        return [str(i) for i in range(top + 1)], used.astype(np.int32)
    present = np.unique(used)
    ordered = sorted(present.tolist(), key=lambda code: names[code])
    remap = np.full(len(names), -1, np.int32)
    remap[ordered] = np.arange(len(ordered), dtype=np.int32)
    return [names[code] for code in ordered], remap[used]


def _refuse(table: Table, left_out: list[dict[str, Any]], skips: list[tuple[int, str, str]],
            no_row: list[dict[str, str]]) -> None:
    """Under ``--strict``: the first row or image the table leaves out is an error."""
    if left_out:
        first = left_out[0]
        raise SkippedFileError(f"{table.shown} row {first['row']} ({first['path']}): {first['reason']}; fix the "
                               "table, or pack without --strict to leave such rows out and list them in the manifest")
    if skips:
        raise SkippedFileError(f"{skips[0][1]}: {skips[0][2]}; fix the table, or pack without --strict to skip the "
                               "image and list it in the manifest")
    if no_row:
        raise SkippedFileError(f"{no_row[0]['path']}: {no_row[0]['reason']}; add a row for it, or pack without "
                               "--strict to leave such images out and list them in the manifest")


def scan_source(src: str | os.PathLike[str], labels: str | os.PathLike[str] | TableOptions | None, strict: bool,
                storage_options: dict[str, Any] | None = None) -> ScanResult:
    """What ``pack`` packs from ``src``: ``scan_folder``'s images, or with a table (``labels``), the
    images it gives a usable row (``TableScan``)."""
    if labels is None:
        return scan_folder(src)
    table = Table(table_options(labels), storage_options)
    return join(scan_for(src, table, storage_options), table, strict)


def table_of(scan: ScanResult) -> TableFields | None:
    """The table a scan was joined with (None for a plain scan)."""
    return scan.table if isinstance(scan, TableScan) else None


def fields_summary(manifest: dict[str, Any]) -> dict[str, Any]:
    """What ``pack``'s summary says of a pack's fields: their names and types, and the table rows
    left out (None for a pack without a table)."""
    fields = manifest.get("fields")
    if fields is None:
        return {"fields": None, "rows_left_out": None}
    return {"fields": {c["name"]: c["type"] for c in fields["columns"]}, "rows_left_out": fields["rows_left_out_count"]}
