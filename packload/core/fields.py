"""The fields part of a pack, encoded and decoded: typed columns of values, one value per record.

A pack made from a table (``pack SRC DEST --labels labels.csv``) stores every column of the table
but the path and the label as a column here, in record order, so that reading one field of every
record is one read of one array. The byte layout (``FIELDS_HEADER``, ``FIELD_COLUMN``, the type codes
and dtypes) is defined in ``packload.core.format``; this module builds and parses it, and nothing
else touches its bytes. ``docs/FORMAT.md`` (Fields) describes it for people, ``docs/FIELDS.md`` for
users.

Layout: the 32-byte header, the column table (48 bytes a column), the UTF-8 column names back to
back, then each column's arrays in column order (a string or list column's offsets before its
values), each starting at the first multiple of 8 after the previous one ends (zero bytes between),
the last one ending the part. Every value is present: a cell that is missing or does not parse
leaves its record out of the pack at packing time, so there is no missing-value marker.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from packload.core.errors import PackFormatError
from packload.core.format import (
    FIELD_ALIGN,
    FIELD_COLUMN,
    FIELD_OFFSETS,
    FIELD_TYPE_CODE,
    FIELD_TYPES,
    FIELD_VALUES,
    FIELDS_HEADER,
    FIELDS_MAGIC,
    FIELDS_NAME,
    FIELDS_VERSION,
    LMDB_FIELDS_KEY,
    VARIABLE_FIELD_TYPES,
)

MAX_NAME_BYTES = 255  # a column's name, in UTF-8
MAX_COLUMNS = 4096
# Spellings accepted for each type (``--field age:int``, ``PackedImageFolder`` error messages).
TYPE_NAMES = {"int": "int", "integer": "int", "int64": "int", "float": "float", "double": "float",
              "float64": "float", "bool": "bool", "boolean": "bool", "str": "string", "string": "string",
              "text": "string", "list[int]": "list[int]", "int[]": "list[int]", "list[float]": "list[float]",
              "float[]": "list[float]"}
_GATHER_VALUES = 1 << 18  # values gathered per step of a string or list column (bounds the index arrays)


def parse_type(text: str) -> str:
    """The field type ``text`` names (``int``, ``float``, ``bool``, ``string``/``str``,
    ``list[int]``, ``list[float]``); ``ValueError`` naming the choices otherwise."""
    name = TYPE_NAMES.get(text.strip().lower().replace(" ", ""))
    if name is None:
        raise ValueError(f"unknown field type {text!r}; choose one of {', '.join(FIELD_TYPES)}")
    return name


def _align(n: int) -> int:
    return -(-n // FIELD_ALIGN) * FIELD_ALIGN


@dataclass
class Column:
    """One field: its name, its type (a ``FIELD_TYPES`` name) and its values as numpy arrays.

    ``values`` has the type's dtype (``FIELD_VALUES``: int64, float64, uint8 0/1 for bool, the
    UTF-8 bytes of the strings as uint8, a list column's elements back to back); ``offsets``
    (strings and lists only) has ``len + 1`` entries: value ``i`` is ``values[offsets[i]:offsets[i + 1]]``."""

    name: str
    type: str
    values: np.ndarray
    offsets: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1 if self.offsets is not None else len(self.values)

    def value(self, i: int) -> Any:
        """Value ``i`` as a Python object (int, float, bool, str, or a list)."""
        if self.offsets is None:
            item = self.values[i].item()
            return bool(item) if self.type == "bool" else item
        start, stop = int(self.offsets[i]), int(self.offsets[i + 1])
        if self.type == "string":
            return _utf8(self.values[start:stop], self.name, i)
        return self.values[start:stop].tolist()


def _utf8(data: np.ndarray, name: str, i: int) -> str:
    try:
        return data.tobytes().decode("utf-8")
    except UnicodeDecodeError:
        raise PackFormatError(f"field {name!r}, record {i}: not valid UTF-8; the pack is damaged") from None


# -- writing ---------------------------------------------------------------------------------------
def _taken_length(column: Column, rows: np.ndarray | None) -> int:
    """Values (bytes for a string) that ``column`` holds for ``rows`` (None: all of them)."""
    if column.type not in VARIABLE_FIELD_TYPES:
        return len(column) if rows is None else len(rows)
    offsets = np.asarray(column.offsets, dtype=np.int64)
    if rows is None:
        return int(offsets[-1] - offsets[0])
    return int((offsets[rows + 1] - offsets[rows]).sum())


def fields_pieces(columns: list[Column], rows: np.ndarray | None = None,
                  release: bool = False) -> Iterator[bytes | memoryview]:
    """The fields part holding ``columns``, each taken at ``rows`` (row ``rows[i]`` of each column
    becomes record ``i``; None: every row, in order), as pieces to write one after the other: the
    header, the column table and the names, then each array (and the zero bytes before it). One
    column's arrays are made at a time; with ``release``, each entry of ``columns`` is set to None once
    its arrays are made, so a caller holding no other reference lets the column go as the part is
    written (a column may read its arrays back from a file: ``values`` and ``offsets`` are asked for
    once each)."""
    names = [column.name.encode("utf-8") for column in columns]
    records = len(rows) if rows is not None else (len(columns[0]) if columns else 0)
    if rows is not None:
        rows = np.asarray(rows, dtype=np.int64)
    table = np.zeros(len(columns), FIELD_COLUMN)
    names_len = sum(map(len, names))
    at = FIELDS_HEADER.itemsize + FIELD_COLUMN.itemsize * len(columns) + names_len
    name_at = 0
    for k, (column, name) in enumerate(zip(columns, names, strict=True)):
        if len(column) != len(columns[0]):
            raise ValueError(f"field {column.name!r}: {len(column)} values, {len(columns[0])} in the first column")
        entry = table[k]
        entry["name_offset"], entry["name_len"], entry["type"] = name_at, len(name), FIELD_TYPE_CODE[column.type]
        name_at += len(name)
        if column.type in VARIABLE_FIELD_TYPES:
            at = _align(at)
            entry["offsets_offset"], entry["offsets_len"] = at, (records + 1) * 8
            at += (records + 1) * 8
        at = _align(at)
        entry["values_offset"] = at
        entry["values_len"] = _taken_length(column, rows) * np.dtype(FIELD_VALUES[column.type]).itemsize
        at += int(entry["values_len"])
    header = np.zeros(1, FIELDS_HEADER)
    header[0] = (FIELDS_MAGIC, FIELDS_VERSION, records, len(columns), FIELD_COLUMN.itemsize, names_len)
    yield header.tobytes() + table.tobytes() + b"".join(names)
    at = FIELDS_HEADER.itemsize + table.nbytes + names_len
    for k, entry in enumerate(table):
        offsets, values = _arrays(columns[k], rows, records)
        if release:
            columns[k] = None  # type: ignore[call-overload]
        for array, start in ((offsets, int(entry["offsets_offset"])), (values, int(entry["values_offset"]))):
            if array is None:
                continue
            yield bytes(start - at)  # the zero bytes up to the array's multiple of FIELD_ALIGN
            yield memoryview(array).cast("B")
            at = start + array.nbytes
        del offsets, values


def encode_fields(columns: list[Column], rows: np.ndarray | None = None, release: bool = False) -> bytearray:
    """The fields part holding ``columns`` (``fields_pieces``), in one buffer."""
    out = bytearray()
    for piece in fields_pieces(columns, rows, release):
        out += piece
    return out


def _arrays(column: Column, rows: np.ndarray | None, records: int) -> tuple[np.ndarray | None, np.ndarray]:
    """``column``'s offsets (None for a fixed-width type) and values, taken at ``rows``, as stored."""
    dtype = np.dtype(FIELD_VALUES[column.type])
    given = column.offsets  # each asked for once: a column may read its arrays back from a file
    source = np.asarray(column.values, dtype=dtype)
    if given is None:
        return None, (source.astype(dtype, copy=True) if rows is None else np.take(source, rows))
    old = np.asarray(given, dtype=np.int64)
    del given
    offsets = np.empty(records + 1, FIELD_OFFSETS)
    if rows is None:
        offsets[:] = old - old[0]
        return offsets, np.array(source[old[0] : old[-1]], dtype=dtype)
    starts = old[rows]
    lengths = old[rows + 1]
    lengths -= starts
    del old
    offsets[0] = 0
    np.cumsum(lengths, out=offsets[1:])
    values = np.empty(int(offsets[-1]), dtype)
    gather_segments(source, starts, lengths, values, offsets[1:].view(np.int64))
    return offsets, values


def gather_segments(source: np.ndarray, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray,
                    ends: np.ndarray | None = None) -> None:
    """Copy ``source[starts[i] : starts[i] + lengths[i]]`` for every ``i``, back to back, into ``out``
    (which holds exactly their sum), a run of segments at a time so that the index arrays stay small.
    ``ends``: the running sums of ``lengths``, when the caller has them."""
    ends = np.cumsum(lengths, dtype=np.int64) if ends is None else ends
    count, first = len(lengths), 0
    while first < count:
        begin = int(ends[first - 1]) if first else 0
        last = min(count, max(first + 1, int(np.searchsorted(ends, begin + _GATHER_VALUES, side="right"))))
        stop = int(ends[last - 1])
        if stop > begin:
            shift = np.repeat(starts[first:last] - (ends[first:last] - lengths[first:last]), lengths[first:last])
            shift += np.arange(begin, stop)
            out[begin:stop] = source[shift]
        first = last


# -- reading ---------------------------------------------------------------------------------------
def decode_fields(buf: bytes | bytearray | memoryview, where: str, records: int) -> list[Column]:
    """Parse a fields part into columns whose arrays are views of ``buf`` (read-only when it is),
    checking everything the header and column table say against the part's size and ``records``
    (the pack's record count) before any array is made: a damaged or hostile part gives
    ``PackFormatError``, never an out-of-bounds read or an absurd allocation."""
    size = len(buf)
    if size < FIELDS_HEADER.itemsize:
        raise PackFormatError(f"{where}: fields part of {size} bytes, too short; the pack is damaged")
    header = np.frombuffer(buf, FIELDS_HEADER, 1)[0]
    if bytes(header["magic"]) != FIELDS_MAGIC:
        raise PackFormatError(f"{where}: not a packload fields part (magic {bytes(header['magic'])!r}); "
                              "the pack is damaged")
    if int(header["version"]) != FIELDS_VERSION:
        raise PackFormatError(f"{where}: fields part version {int(header['version'])}, this packload reads "
                              f"version {FIELDS_VERSION}; upgrade packload to read this pack's fields")
    if int(header["records"]) != records:
        raise PackFormatError(f"{where}: fields part holds {int(header['records'])} values per column, the pack "
                              f"{records} records; the pack is damaged")
    count, names_len = int(header["columns"]), int(header["names_len"])
    if int(header["column_size"]) != FIELD_COLUMN.itemsize:
        raise PackFormatError(f"{where}: fields column entries of {int(header['column_size'])} bytes, expected "
                              f"{FIELD_COLUMN.itemsize}; the pack is damaged")
    if count > MAX_COLUMNS or names_len > count * MAX_NAME_BYTES:
        raise PackFormatError(f"{where}: fields part claims {count} columns and {names_len} bytes of names; "
                              "the pack is damaged")
    names_at = FIELDS_HEADER.itemsize + count * FIELD_COLUMN.itemsize
    at = names_at + names_len
    if at > size:
        raise PackFormatError(f"{where}: fields column table runs past the end of the part; the pack is damaged")
    table = np.frombuffer(buf, FIELD_COLUMN, count, FIELDS_HEADER.itemsize)
    names_blob = bytes(memoryview(buf)[names_at : names_at + names_len])
    columns: list[Column] = []
    seen: set[str] = set()
    name_at = 0
    for k, entry in enumerate(table):
        name_len = int(entry["name_len"])
        if int(entry["name_offset"]) != name_at or not 0 < name_len <= MAX_NAME_BYTES or name_at + name_len > names_len:
            raise PackFormatError(f"{where}: fields column {k}: its name is not where the table says; the pack "
                                  "is damaged")
        try:
            name = names_blob[name_at : name_at + name_len].decode("utf-8")
        except UnicodeDecodeError:
            raise PackFormatError(f"{where}: fields column {k}: name is not valid UTF-8; the pack is damaged") from None
        name_at += name_len
        if name in seen:
            raise PackFormatError(f"{where}: two fields named {name!r}; the pack is damaged")
        seen.add(name)
        code = int(entry["type"])
        if code >= len(FIELD_TYPES):
            raise PackFormatError(f"{where}: field {name!r}: unknown type code {code}; upgrade packload, or the "
                                  "pack is damaged")
        kind = FIELD_TYPES[code]
        columns.append(_column(buf, where, name, kind, entry, records, at))
        at = int(entry["values_offset"]) + int(entry["values_len"])
    if name_at != names_len:
        raise PackFormatError(f"{where}: fields names blob of {names_len} bytes, but the names end at {name_at}; "
                              "the pack is damaged")
    if at != size:
        raise PackFormatError(f"{where}: fields part of {size:,} bytes, but its arrays end at {at:,}; the pack is "
                              "damaged")
    return columns


def _column(buf: Any, where: str, name: str, kind: str, entry: np.void, records: int, at: int) -> Column:
    """One column's arrays, each checked to lie where the layout puts it (after ``at``)."""
    dtype = np.dtype(FIELD_VALUES[kind])
    size = len(buf)
    bad = f"{where}: field {name!r}: "
    offsets = None
    if kind in VARIABLE_FIELD_TYPES:
        at = _align(at)
        if int(entry["offsets_offset"]) != at or int(entry["offsets_len"]) != (records + 1) * 8 \
                or at + (records + 1) * 8 > size:
            raise PackFormatError(bad + "its offsets are not where the layout puts them; the pack is damaged")
        offsets = np.frombuffer(buf, FIELD_OFFSETS, records + 1, at)
        at += (records + 1) * 8
    elif int(entry["offsets_offset"]) or int(entry["offsets_len"]):
        raise PackFormatError(bad + f"a {kind} field with offsets; the pack is damaged")
    at = _align(at)
    length = int(entry["values_len"])
    if int(entry["values_offset"]) != at or at + length > size or length % dtype.itemsize:
        raise PackFormatError(bad + "its values are not where the layout puts them; the pack is damaged")
    count = length // dtype.itemsize
    if offsets is None and count != records:
        raise PackFormatError(bad + f"{count} values for {records} records; the pack is damaged")
    if offsets is not None and records and (int(offsets[0]) != 0 or int(offsets[-1]) != count
                                            or bool((offsets[1:] < offsets[:-1]).any())):
        raise PackFormatError(bad + "its offsets are not in order within its values; the pack is damaged")
    if offsets is not None and not records and int(offsets[0]) != count:
        raise PackFormatError(bad + "its offsets do not match its values; the pack is damaged")
    values = np.frombuffer(buf, dtype, count, at)
    if kind == "bool" and count and int(values.max()) > 1:
        raise PackFormatError(bad + "a bool value other than 0 or 1; the pack is damaged")
    return Column(name, kind, values, offsets)


# -- the manifest's "fields" object ----------------------------------------------------------------
def part_name(backend: str) -> str:
    """Where a pack of ``backend`` keeps its fields part: a file name, or an LMDB key."""
    return FIELDS_NAME if backend == "shards" else LMDB_FIELDS_KEY.decode()


def manifest_fields_ok(value: Any) -> bool:
    """Whether a manifest's ``fields`` object has the shape readers rely on (docs/FORMAT.md)."""
    if not isinstance(value, dict):
        return False
    columns, left_out = value.get("columns"), value.get("rows_left_out", [])
    part = (value.get("name") in (FIELDS_NAME, LMDB_FIELDS_KEY.decode()) and type(value.get("size")) is int
            and value["size"] >= FIELDS_HEADER.itemsize and isinstance(value.get("sha256"), str))
    listed = isinstance(columns, list) and all(
        isinstance(c, dict) and isinstance(c.get("name"), str) and c.get("type") in FIELD_TYPES for c in columns)
    label = value.get("label_column") is None or isinstance(value.get("label_column"), str)
    rows = isinstance(left_out, list) and all(isinstance(r, dict) and isinstance(r.get("reason", ""), str)
                                              for r in left_out)
    count = value.get("rows_left_out_count", len(left_out) if isinstance(left_out, list) else 0)
    return part and listed and label and rows and type(count) is int and count >= len(left_out)


def check_columns_match(columns: Sequence[Column], listed: list[dict[str, Any]], where: str) -> None:
    """The part's columns must be the ones the manifest lists, in order, with their types."""
    found = [{"name": c.name, "type": c.type} for c in columns]
    wanted = [{"name": c["name"], "type": c["type"]} for c in listed]
    if found != wanted:
        raise PackFormatError(f"{where}: the fields part holds other columns than the manifest lists; the pack "
                              "is damaged")
