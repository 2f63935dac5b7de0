"""The on-disk format of a pack, defined once: the writers in ``packer`` and the readers in
``loaders`` both import this module, and nobody else hand-codes a byte offset.

A pack is a sequence of *records*. A record is a fixed 56-byte header (``RECORD_HEADER``), the
record's original relative path in UTF-8, then the payload (the image file's bytes, a re-encoded
image, or raw uint8 pixels). Records are grouped into *parts*: for the ``shards`` backend a part is a
data file ``shard-NNNNN.bin``; for the ``lmdb`` backend a part is one LMDB value (a chunk of about
1 MiB of consecutive records) stored under the key ``c`` + the part number as 8 big-endian bytes.
An *index* (``INDEX_HEADER`` then one ``INDEX_ENTRY`` per record then a blob of paths) says where
every record's payload lies, and a JSON *manifest* describes the whole pack. Every integer is
little-endian; offsets and lengths are 64-bit. ``docs/FORMAT.md`` describes the same for people.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packload.core.errors import PackFormatError

FORMAT_NAME = "packload"
FORMAT_VERSION = 1

BACKENDS = ("shards", "lmdb")
ENCODINGS = ("keep", "jpeg", "png", "raw")

MANIFEST_NAME = "manifest.json"  # shards: a file in the pack folder
INDEX_NAME = "index.bin"  # shards: a file in the pack folder
PROGRESS_NAME = "progress.json"  # shards: only in an unfinished pack, what ``pack --resume`` needs
# An unfinished pack is written beside its destination as DEST + this suffix, and renamed (or, at a
# URL, published) once complete: nothing at DEST ever looks valid before then.
PARTIAL_SUFFIX = ".partial"
# ``pack --engine ray``: only in an unfinished pack. The run record (options, source, ranges) beside
# the task folders, and in each task folder the markers written last: packed, then placed.
RAY_RUN_NAME = "ray-run.json"
TASK_DONE_NAME = "task-done.json"
TASK_PLACED_NAME = "task-placed.json"


def shard_name(part: int) -> str:
    """File name of shard number ``part`` inside a shards folder."""
    return f"shard-{part:05d}.bin"


def pack_size(path: Path) -> int:
    """Bytes the pack at ``path`` takes: the LMDB file, or every file of the shards folder."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    return path.stat().st_size


SHARD_NAME_PATTERN = r"shard-\d{5,}\.bin"  # every name ``shard_name`` gives, as a regular expression


def shard_number(name: str) -> int | None:
    """The part number of the shard file called ``name``; None when it is not a shard's name."""
    return int(name[len("shard-") : -len(".bin")]) if re.fullmatch(SHARD_NAME_PATTERN, name) else None


# LMDB keys. Metadata keys ("#...") sort before the chunks ("c" + number), so chunks are appended
# in key order and a cursor from the first chunk key reads the records in order.
LMDB_CHUNK_PREFIX = b"c"
LMDB_MANIFEST_KEY = b"#manifest"
LMDB_INDEX_KEY = b"#index"
PROGRESS_KEY = b"#progress"  # only in an unfinished pack, what ``pack --resume`` needs


def lmdb_chunk_key(part: int) -> bytes:
    """LMDB key of chunk ``part``: ``b"c"`` + 8 big-endian bytes, so keys sort in write order."""
    return LMDB_CHUNK_PREFIX + part.to_bytes(8, "big")


RECORD_MAGIC = b"PLR1"
RECORD_HEADER = np.dtype(
    [
        ("magic", "S4"),  # b"PLR1"
        ("header_crc32", "<u4"),  # CRC-32 of header bytes 8..56 followed by the path bytes
        ("record", "<u8"),  # record number: its position in the index
        ("payload_len", "<u8"),
        ("payload_crc32", "<u4"),  # CRC-32 of the payload
        ("label", "<i4"),  # class index, -1 when the pack is unlabelled
        ("width", "<u4"),  # of the stored image, in pixels
        ("height", "<u4"),
        ("path_len", "<u2"),  # bytes of UTF-8 path that follow the header
        ("format", "u1"),  # payload format code, see PAYLOAD_FORMATS
        ("orientation", "u1"),  # EXIF orientation 1..8 of the source, 0 when it has none
        ("mode", "S8"),  # PIL mode of the stored image, ASCII, NUL-padded ("RGB", "L", "P", ...)
        ("reserved", "<u4"),  # zero
    ]
)
assert RECORD_HEADER.itemsize == 56

INDEX_MAGIC = b"PLIX"
INDEX_HEADER = np.dtype(
    [
        ("magic", "S4"),  # b"PLIX"
        ("version", "<u4"),  # FORMAT_VERSION
        ("count", "<u8"),  # number of records
        ("entry_size", "<u4"),  # INDEX_ENTRY.itemsize
        ("reserved", "<u4"),
        ("paths_len", "<u8"),  # bytes in the paths blob after the entries
    ]
)
assert INDEX_HEADER.itemsize == 32

INDEX_ENTRY = np.dtype(
    [
        ("part", "<u4"),  # shard number (shards) or chunk number (lmdb)
        ("label", "<i4"),
        ("payload_offset", "<u8"),  # from the start of the shard file or of the chunk value
        ("payload_len", "<u8"),
        ("record_offset", "<u8"),  # where the record's header starts in the part
        ("payload_crc32", "<u4"),
        ("width", "<u4"),
        ("height", "<u4"),
        ("path_offset", "<u8"),  # into the paths blob
        ("path_len", "<u2"),
        ("format", "u1"),
        ("orientation", "u1"),
        ("mode", "S8"),
    ]
)
assert INDEX_ENTRY.itemsize == 64

SHARD_MAGIC = b"PLSD"
SHARD_HEADER = np.dtype([("magic", "S4"), ("version", "<u4"), ("part", "<u4"), ("reserved", "<u4")])
assert SHARD_HEADER.itemsize == 16


def encode_shard_header(part: int) -> bytes:
    """The 16 bytes that start shard file number ``part``."""
    header = np.zeros(1, SHARD_HEADER)
    header[0] = (SHARD_MAGIC, FORMAT_VERSION, part, 0)
    return header.tobytes()


def decode_shard_header(head: bytes | memoryview) -> tuple[int, int] | None:
    """(format version, part number) from a shard file's first bytes ``head``; None when they are
    not a shard header."""
    if len(head) < SHARD_HEADER.itemsize:
        return None
    header = np.frombuffer(head, SHARD_HEADER, 1)[0]
    return (int(header["version"]), int(header["part"])) if bytes(header["magic"]) == SHARD_MAGIC else None


# Payload format codes. "raw" is uint8 RGB pixels, height x width x 3, row-major (mode "RGB").
PAYLOAD_FORMATS = ("raw", "JPEG", "PNG", "BMP", "TIFF", "WEBP", "PPM", "MPO", "other")
FORMAT_CODE = {name: code for code, name in enumerate(PAYLOAD_FORMATS)}
RAW_CHANNELS = 3
# The image formats packload lets Pillow decode, at pack time and at read time (Pillow's
# ``Image.open(..., formats=DECODABLE)``): the ImageFolder extensions' formats and GIF. Others are
# refused, because some of Pillow's plugins start external programs (EPS and PS run Ghostscript)
# and every plugin is code run on data from elsewhere.
DECODABLE = ("JPEG", "MPO", "PNG", "BMP", "TIFF", "WEBP", "PPM", "GIF")



def struct_of(layout: np.dtype, first: str | None = None) -> struct.Struct:
    """The ``struct`` format of ``layout`` (from its field ``first`` on): the same bytes, for writers
    that pack one record at a time. Derived, so the layout is written down once, as the dtype."""
    codes = {"<u8": "Q", "<i8": "q", "<u4": "I", "<i4": "i", "<u2": "H", "|u1": "B"}
    names = list(layout.names)
    fields = [layout.fields[name][0] for name in names[names.index(first) if first else 0 :]]
    return struct.Struct("<" + "".join(f"{f.itemsize}s" if f.kind == "S" else codes[f.str] for f in fields))


# The record header from ``record`` on (after magic and header_crc32) and the index entry as
# ``struct`` formats, and the offsets of the fields that merging rewrites in place.
RECORD_HEADER_BODY = struct_of(RECORD_HEADER, "record")
INDEX_ENTRY_STRUCT = struct_of(INDEX_ENTRY)
U32, I32, U64 = struct.Struct("<I"), struct.Struct("<i"), struct.Struct("<Q")
HEADER_CRC_AT = RECORD_HEADER.fields["header_crc32"][1]  # covers the header from here on, then the path
HEADER_BODY_AT = RECORD_HEADER.fields["record"][1]
RECORD_NUMBER_AT = RECORD_HEADER.fields["record"][1]
RECORD_LABEL_AT = RECORD_HEADER.fields["label"][1]
SHARD_PART_AT = SHARD_HEADER.fields["part"][1]
assert HEADER_BODY_AT + RECORD_HEADER_BODY.size == RECORD_HEADER.itemsize
assert INDEX_ENTRY_STRUCT.size == INDEX_ENTRY.itemsize

MAX_PATH_BYTES = 0xFFFF  # a record's path is at most this long (its length is a u16)
# Index offsets and lengths must stay below this, so that the sum of any two fits a signed 64-bit
# integer (readers compute byte ranges in int64, and hand addresses to compiled code).
INDEX_VALUE_LIMIT = 1 << 62
MAX_ORIENTATION = 8  # EXIF orientations are 1..8; 0 means none
SIDEWAYS_ORIENTATIONS = (5, 6, 7, 8)  # stored turned a quarter: upright, width and height swap


@dataclass(frozen=True)
class RecordMeta:
    """What the header says about one record, besides its payload."""

    record: int
    label: int
    width: int
    height: int
    format: str
    mode: str
    orientation: int
    path: str


def _utf8(raw: bytes, record: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PackFormatError(f"record {record}: stored path is not valid UTF-8; the pack is damaged") from None


def payload_format_code(pil_format: str | None) -> int:
    """The code stored for a PIL format name; unknown formats are stored as ``other``."""
    return FORMAT_CODE.get(pil_format or "other", FORMAT_CODE["other"])


def encode_record(meta: RecordMeta, payload: bytes | memoryview, payload_crc: int | None = None) -> tuple[bytes, int]:
    """Return (header + path bytes, payload CRC-32) for one record; the payload follows them.
    ``payload_crc`` may be given when already computed (it is not checked)."""
    path = meta.path.encode("utf-8")
    if len(path) > 0xFFFF:
        raise PackFormatError(f"{meta.path[:80]}...: path longer than 65535 bytes; shorten it")
    if payload_crc is None:
        payload_crc = zlib.crc32(payload)
    body = RECORD_HEADER_BODY.pack(
        meta.record,
        len(payload),
        payload_crc,
        meta.label,
        meta.width,
        meta.height,
        len(path),
        payload_format_code(meta.format),
        meta.orientation,
        meta.mode.encode("ascii"),
        0,
    )
    header_crc = zlib.crc32(path, zlib.crc32(body))
    return RECORD_MAGIC + U32.pack(header_crc) + body + path, payload_crc


def decode_record_header(buf: bytes | memoryview, offset: int = 0) -> tuple[RecordMeta, int, int, int]:
    """Parse the record at ``offset`` of ``buf``.

    Returns (meta, payload_offset, payload_len, payload_crc32). Raises ``PackFormatError`` when
    the bytes are not a whole, intact record header (bad magic, bad CRC, lengths past the end).
    """
    end = len(buf)
    size = RECORD_HEADER.itemsize
    if offset < 0 or offset + size > end:
        raise PackFormatError(f"record header at offset {offset} runs past the end ({end} bytes)")
    view = memoryview(buf)[offset : offset + size]
    if bytes(view[:4]) != RECORD_MAGIC:
        raise PackFormatError(f"no record at offset {offset}: bad magic {bytes(view[:4])!r}")
    (header_crc,) = U32.unpack_from(view, HEADER_CRC_AT)
    (record, payload_len, payload_crc, label, width, height, path_len, fmt, orientation, mode, _) = (
        RECORD_HEADER_BODY.unpack_from(view, HEADER_BODY_AT)
    )
    path_start = offset + size
    payload_start = path_start + path_len
    if payload_start > end:
        raise PackFormatError(f"record {record} at offset {offset}: path runs past the end")
    path = bytes(memoryview(buf)[path_start:payload_start])
    if zlib.crc32(path, zlib.crc32(view[HEADER_BODY_AT:])) != header_crc:
        raise PackFormatError(f"record header at offset {offset}: header checksum mismatch")
    if payload_start + payload_len > end:
        raise PackFormatError(f"record {record} at offset {offset}: payload runs past the end")
    if fmt >= len(PAYLOAD_FORMATS):
        raise PackFormatError(f"record {record} at offset {offset}: unknown payload format {fmt}")
    meta = RecordMeta(
        record=record,
        label=label,
        width=width,
        height=height,
        format=PAYLOAD_FORMATS[fmt],
        mode=mode.rstrip(b"\0").decode("ascii", "replace"),
        orientation=orientation,
        path=_utf8(path, record),
    )
    return meta, payload_start, payload_len, payload_crc


def index_entry(meta: RecordMeta, part: int, record_offset: int, payload_len: int, payload_crc: int,
                path_offset: int) -> tuple:
    """One ``INDEX_ENTRY`` row (as a tuple) for a record written at ``record_offset`` of ``part``."""
    path_len = len(meta.path.encode("utf-8"))
    return (
        part,
        meta.label,
        record_offset + RECORD_HEADER.itemsize + path_len,
        payload_len,
        record_offset,
        payload_crc,
        meta.width,
        meta.height,
        path_offset,
        path_len,
        payload_format_code(meta.format),
        meta.orientation,
        meta.mode.encode("ascii"),
    )


def encode_index_header(count: int, paths_len: int) -> bytes:
    """The 32 bytes that start an index of ``count`` entries and ``paths_len`` bytes of paths."""
    header = np.zeros(1, INDEX_HEADER)
    header[0] = (INDEX_MAGIC, FORMAT_VERSION, count, INDEX_ENTRY.itemsize, 0, paths_len)
    return header.tobytes()


def encode_index(entries: np.ndarray, paths: bytes) -> bytes:
    """Serialise the index: ``INDEX_HEADER``, the entries, then the paths blob."""
    return encode_index_header(len(entries), len(paths)) + entries.astype(INDEX_ENTRY, copy=False).tobytes() + paths


def decode_index(buf: bytes | memoryview, where: str, records: int | None = None,
                 part_bytes: int | None = None) -> tuple[np.ndarray, bytes]:
    """Parse an index blob into (entries, paths), checking every count against the blob's size.

    ``where`` names the file for error messages. Entries are a read-only view when ``buf`` is.
    Every size the header gives is checked against what can be true before the entries are read
    or the paths copied (a sparse index of a header that adds up must cost neither time nor
    memory): the count against ``records`` (the manifest's) and against ``part_bytes`` (the bytes
    the parts hold: each record takes at least its 56-byte header there), the paths blob against
    the longest paths the records can have, then against where their paths end.
    """
    size = len(buf)
    if size < INDEX_HEADER.itemsize:
        raise PackFormatError(f"{where}: index is {size} bytes, too short to be a packload index")
    header = np.frombuffer(buf, INDEX_HEADER, count=1)[0]
    if bytes(header["magic"]) != INDEX_MAGIC:
        raise PackFormatError(f"{where}: not a packload index (magic {bytes(header['magic'])!r})")
    if int(header["version"]) != FORMAT_VERSION:
        raise PackFormatError(
            f"{where}: index version {int(header['version'])}, this packload reads version "
            f"{FORMAT_VERSION}; upgrade packload or re-pack"
        )
    count, paths_len = int(header["count"]), int(header["paths_len"])
    if int(header["entry_size"]) != INDEX_ENTRY.itemsize:
        raise PackFormatError(f"{where}: index entries of {int(header['entry_size'])} bytes, expected 64")
    expected = INDEX_HEADER.itemsize + count * INDEX_ENTRY.itemsize + paths_len
    if expected != size:
        raise PackFormatError(f"{where}: index claims {count} records and {paths_len} path bytes "
                              f"({expected} bytes) but holds {size} bytes; the pack is damaged")
    if records is not None and count != records:
        raise PackFormatError(f"{where}: manifest says {records} records, index holds {count}; the pack is damaged")
    if part_bytes is not None and count * RECORD_HEADER.itemsize > part_bytes:
        raise PackFormatError(f"{where}: index claims {count} records, more than the {part_bytes:,} bytes of the "
                              "pack's parts can hold; the pack is damaged")
    if paths_len > count * MAX_PATH_BYTES:
        raise PackFormatError(f"{where}: paths blob of {paths_len:,} bytes, more than {count} paths of at most "
                              f"{MAX_PATH_BYTES} bytes can take; the pack is damaged")
    entries = np.frombuffer(buf, INDEX_ENTRY, count=count, offset=INDEX_HEADER.itemsize)
    ends = entries["path_offset"].astype(np.uint64) + entries["path_len"].astype(np.uint64)
    if count and (int(ends.max()) > paths_len or (ends < entries["path_offset"]).any()):
        raise PackFormatError(f"{where}: index points past its paths blob; the pack is damaged")
    reach = int(ends.max()) if count else 0
    if reach != paths_len:  # the blob is the paths back to back: bytes past the last are no record's
        raise PackFormatError(f"{where}: paths blob of {paths_len:,} bytes, but the records' paths end at "
                              f"{reach:,}; the rest is no record's, the pack is damaged")
    paths = bytes(memoryview(buf)[INDEX_HEADER.itemsize + count * INDEX_ENTRY.itemsize :])  # bounded above
    if count and int(entries["format"].max()) >= len(PAYLOAD_FORMATS):
        raise PackFormatError(f"{where}: index holds an unknown payload format code; the pack is damaged")
    if count and int(entries["orientation"].max()) > MAX_ORIENTATION:
        raise PackFormatError(f"{where}: index holds an EXIF orientation above {MAX_ORIENTATION}; the pack is damaged")
    for name in ("payload_offset", "payload_len", "record_offset", "path_offset"):
        if count and int(entries[name].max()) >= INDEX_VALUE_LIMIT:
            first = int(np.flatnonzero(entries[name] >= np.uint64(INDEX_VALUE_LIMIT))[0])
            raise PackFormatError(f"{where}: record {first}: index {name} {int(entries[name][first])} is past any "
                                  "file's size; the pack is damaged")
    # Each payload follows its header and path: payload_offset == record_offset + 56 + path_len.
    headers = entries["record_offset"] + np.uint64(RECORD_HEADER.itemsize) + entries["path_len"].astype(np.uint64)
    wrong = (headers != entries["payload_offset"]) | (headers < entries["record_offset"])
    if count and wrong.any():
        raise PackFormatError(f"{where}: record {int(np.flatnonzero(wrong)[0])}: index offsets do not agree "
                              "(payload must follow header and path); the pack is damaged")
    return entries, paths


MAX_SIDE = 1 << 24  # no stored image is wider or taller (PIL refuses far smaller ones as bombs)
# The payload formats each encoding may hold (``keep``: what the sources were, anything but raw).
ENCODING_FORMATS = {"raw": ("raw",), "jpeg": ("JPEG",), "png": ("PNG",),
                    "keep": tuple(name for name in PAYLOAD_FORMATS if name != "raw")}


def check_entries(entries: np.ndarray, encoding: str, where: str) -> None:
    """Refuse entries no packer writes: a side of 0 or past ``MAX_SIDE``, a payload format the pack's
    encoding does not hold, and raw payloads that are not ``width * height * 3`` bytes."""
    if not len(entries):
        return
    for side in ("width", "height"):
        values = entries[side]
        bad = (values == 0) | (values > MAX_SIDE)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise PackFormatError(f"{where}: record {first}: index {side} {int(values[first])} is not an image's; "
                                  "the pack is damaged")
    allowed = np.isin(entries["format"], [FORMAT_CODE[name] for name in ENCODING_FORMATS[encoding]])
    if not allowed.all():
        first = int(np.flatnonzero(~allowed)[0])
        raise PackFormatError(f"{where}: record {first}: a {PAYLOAD_FORMATS[int(entries['format'][first])]} payload "
                              f"in a pack of encoding {encoding!r}; the pack is damaged")
    check_raw_sizes(entries, where)


def check_raw_sizes(entries: np.ndarray, where: str) -> None:
    """Refuse raw records whose payload is not ``width * height * 3`` bytes (damaged or hostile)."""
    raw = entries["format"] == FORMAT_CODE["raw"]
    if not raw.any():
        return
    sizes = entries[raw]
    pixels = sizes["width"].astype(np.uint64) * sizes["height"].astype(np.uint64)  # < 2**64: no overflow
    length = sizes["payload_len"]
    bad = (length % np.uint64(RAW_CHANNELS) != 0) | (length // np.uint64(RAW_CHANNELS) != pixels)
    if bad.any():
        raise PackFormatError(f"{where}: record {int(np.flatnonzero(raw)[np.flatnonzero(bad)[0]])}: raw payload "
                              "length does not match its width and height; the pack is damaged")


def check_entries_fit(entries: np.ndarray, part_sizes: np.ndarray, where: str) -> None:
    """Refuse an index whose entries point outside their parts (damaged or hostile packs)."""
    if len(entries) == 0:
        return
    parts = entries["part"].astype(np.int64)
    if int(parts.max()) >= len(part_sizes):
        raise PackFormatError(f"{where}: index names part {int(parts.max())} but the pack has "
                              f"{len(part_sizes)}; the pack is damaged")
    ends = entries["payload_offset"] + entries["payload_len"]
    # An overflow in the sum would wrap below the offset: catch that too.
    bad = (ends > part_sizes[parts].astype(np.uint64)) | (ends < entries["payload_offset"])
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise PackFormatError(f"{where}: record {first} points past the end of part "
                              f"{int(parts[first])}; the pack is damaged")


def part_reach(entries: np.ndarray, parts: int, empty: int) -> np.ndarray:
    """Where the last record of each of ``parts`` parts ends (int64; ``empty`` for a part with no
    record): how long the part must be, and no longer, since records lie back to back to its end."""
    reach = np.full(parts, empty, np.int64)
    if len(entries):
        numbers = entries["part"].astype(np.int64)
        inside = numbers < parts
        np.maximum.at(reach, numbers[inside], (entries["payload_offset"][inside]
                                                + entries["payload_len"][inside]).astype(np.int64))
    return reach


def check_parts_reached(entries: np.ndarray, part_sizes: np.ndarray, names: list[str], where: str) -> None:
    """Refuse a shard longer than its records reach (after ``check_entries_fit``): a tail that no
    record accounts for is damage, or a file not of this pack (a sparse file of a terabyte, say), and
    nothing should ever read or hash it. ``names`` name the shards in the message."""
    reach = part_reach(entries, len(part_sizes), SHARD_HEADER.itemsize)
    longer = np.flatnonzero(np.asarray(part_sizes, dtype=np.int64) > reach)
    if len(longer):
        part = int(longer[0])
        raise PackFormatError(f"{where}/{names[part]}: {int(part_sizes[part]):,} bytes, but its records end at "
                              f"{int(reach[part]):,}: {int(part_sizes[part]) - int(reach[part]):,} bytes no record "
                              "accounts for; the pack is damaged, or the shard is not this pack's: copy the pack again")


def entry_path(entries: np.ndarray, paths: bytes, i: int) -> str:
    """The original relative path of record ``i``."""
    start = int(entries["path_offset"][i])
    try:
        return paths[start : start + int(entries["path_len"][i])].decode("utf-8")
    except UnicodeDecodeError:
        raise PackFormatError(f"record {i}: stored path is not valid UTF-8; the pack is damaged") from None


# -- fields: typed columns from a table packed beside the images (``pack --labels``) ----------------
# A pack made from a table holds one more part: every column of the table but the path and the label
# as a column of values per record, in record order. ``shards``: the file ``fields.bin``; ``lmdb``:
# the value of ``#fields``. The same bytes in both. A pack without fields has no such part.
FIELDS_NAME = "fields.bin"
LMDB_FIELDS_KEY = b"#fields"
FIELDS_MAGIC = b"PLFD"
FIELDS_VERSION = 1  # of the fields part; the records and the index keep FORMAT_VERSION
FIELDS_HEADER = np.dtype(
    [
        ("magic", "S4"),  # b"PLFD"
        ("version", "<u4"),  # FIELDS_VERSION
        ("records", "<u8"),  # values per column: the pack's record count
        ("columns", "<u4"),  # entries in the column table that follows the header
        ("column_size", "<u4"),  # FIELD_COLUMN.itemsize
        ("names_len", "<u8"),  # bytes of UTF-8 column names after the column table
    ]
)
assert FIELDS_HEADER.itemsize == 32
FIELD_COLUMN = np.dtype(
    [
        ("name_offset", "<u8"),  # into the names blob
        ("name_len", "<u4"),
        ("type", "u1"),  # FIELD_TYPES code
        ("reserved", "S3"),  # zero
        ("values_offset", "<u8"),  # from the start of the part
        ("values_len", "<u8"),  # bytes
        ("offsets_offset", "<u8"),  # strings and lists: records + 1 u64 offsets; 0 for other types
        ("offsets_len", "<u8"),  # bytes; 0 for other types
    ]
)
assert FIELD_COLUMN.itemsize == 48
# Type codes, and the little-endian dtype of each type's values. Strings are UTF-8 bytes; a list
# column's values are every record's elements back to back. Offsets count values (bytes for a
# string), so record ``i``'s value is ``values[offsets[i]:offsets[i + 1]]``.
FIELD_TYPES = ("int", "float", "bool", "string", "list[int]", "list[float]")
FIELD_TYPE_CODE = {name: code for code, name in enumerate(FIELD_TYPES)}
FIELD_VALUES = {"int": "<i8", "float": "<f8", "bool": "u1", "string": "u1", "list[int]": "<i8", "list[float]": "<f8"}
FIELD_OFFSETS = "<u8"
VARIABLE_FIELD_TYPES = ("string", "list[int]", "list[float]")  # the types with offsets
FIELD_ALIGN = 8  # every array starts at a multiple of this from the start of the part (zero bytes between)
