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

import datetime as _dt
import json
import struct
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from packload.core.errors import PackFormatError
from packload.core.version import __version__

FORMAT_NAME = "packload"
FORMAT_VERSION = 1

BACKENDS = ("shards", "lmdb")
ENCODINGS = ("keep", "jpeg", "png", "raw")

MANIFEST_NAME = "manifest.json"  # shards: a file in the pack folder
INDEX_NAME = "index.bin"  # shards: a file in the pack folder


def shard_name(part: int) -> str:
    """File name of shard number ``part`` inside a shards folder."""
    return f"shard-{part:05d}.bin"


# LMDB keys. Metadata keys ("#...") sort before the chunks ("c" + number), so chunks are appended
# in key order and a cursor from the first chunk key reads the records in order.
LMDB_CHUNK_PREFIX = b"c"
LMDB_MANIFEST_KEY = b"#manifest"
LMDB_INDEX_KEY = b"#index"


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

# Payload format codes. "raw" is uint8 RGB pixels, height x width x 3, row-major (mode "RGB").
PAYLOAD_FORMATS = ("raw", "JPEG", "PNG", "BMP", "TIFF", "WEBP", "PPM", "MPO", "other")
FORMAT_CODE = {name: code for code, name in enumerate(PAYLOAD_FORMATS)}
RAW_CHANNELS = 3
# The image formats packload lets Pillow decode, at pack time and at read time (Pillow's
# ``Image.open(..., formats=DECODABLE)``): the ImageFolder extensions' formats and GIF. Others are
# refused, because some of Pillow's plugins start external programs (EPS and PS run Ghostscript)
# and every plugin is code run on data from elsewhere.
DECODABLE = ("JPEG", "MPO", "PNG", "BMP", "TIFF", "WEBP", "PPM", "GIF")

_HEADER_BODY = struct.Struct("<QQIiIIHBB8sI")  # the header after magic and header_crc32
assert _HEADER_BODY.size + 8 == RECORD_HEADER.itemsize

# Manifest fields every reader checks before anything else.
MANIFEST_REQUIRED = ("format", "version", "backend", "encoding", "records", "classes", "skipped")
# A reader refuses a larger manifest before parsing it (every DataLoader worker parses its own):
# writers keep theirs far below by listing at most this many skipped and left-out files.
MANIFEST_LIMIT = 64 << 20
SKIPPED_LISTED = 100_000  # broken files named in the manifest; the rest are counted (``skipped_count``)
IGNORED_LISTED = 1_000  # files left out (not images, hidden) named; the rest counted by reason
# Index offsets and lengths must stay below this, so that the sum of any two fits a signed 64-bit
# integer (readers compute byte ranges in int64, and hand addresses to compiled code).
INDEX_VALUE_LIMIT = 1 << 62
MAX_ORIENTATION = 8  # EXIF orientations are 1..8; 0 means none


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
    body = _HEADER_BODY.pack(
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
    return RECORD_MAGIC + struct.pack("<I", header_crc) + body + path, payload_crc


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
    (header_crc,) = struct.unpack_from("<I", view, 4)
    (record, payload_len, payload_crc, label, width, height, path_len, fmt, orientation, mode, _) = (
        _HEADER_BODY.unpack_from(view, 8)
    )
    path_start = offset + size
    payload_start = path_start + path_len
    if payload_start > end:
        raise PackFormatError(f"record {record} at offset {offset}: path runs past the end")
    path = bytes(memoryview(buf)[path_start:payload_start])
    if zlib.crc32(path, zlib.crc32(view[8:])) != header_crc:
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


def encode_index(entries: np.ndarray, paths: bytes) -> bytes:
    """Serialise the index: ``INDEX_HEADER``, the entries, then the paths blob."""
    header = np.zeros(1, INDEX_HEADER)
    header[0] = (INDEX_MAGIC, FORMAT_VERSION, len(entries), INDEX_ENTRY.itemsize, 0, len(paths))
    return header.tobytes() + entries.astype(INDEX_ENTRY, copy=False).tobytes() + paths


def decode_index(buf: bytes | memoryview, where: str) -> tuple[np.ndarray, bytes]:
    """Parse an index blob into (entries, paths), checking every count against the blob's size.

    ``where`` names the file for error messages. Entries are a read-only view when ``buf`` is.
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
    entries = np.frombuffer(buf, INDEX_ENTRY, count=count, offset=INDEX_HEADER.itemsize)
    paths = bytes(memoryview(buf)[INDEX_HEADER.itemsize + count * INDEX_ENTRY.itemsize :])
    ends = entries["path_offset"].astype(np.uint64) + entries["path_len"].astype(np.uint64)
    if count and (int(ends.max()) > paths_len or (ends < entries["path_offset"]).any()):
        raise PackFormatError(f"{where}: index points past its paths blob; the pack is damaged")
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


def entry_path(entries: np.ndarray, paths: bytes, i: int) -> str:
    """The original relative path of record ``i``."""
    start = int(entries["path_offset"][i])
    try:
        return paths[start : start + int(entries["path_len"][i])].decode("utf-8")
    except UnicodeDecodeError:
        raise PackFormatError(f"record {i}: stored path is not valid UTF-8; the pack is damaged") from None


def encode_manifest(manifest: dict[str, Any]) -> bytes:
    """The manifest as UTF-8 JSON bytes (sorted keys, so equal packs give equal manifests)."""
    return (json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def decode_manifest(raw: bytes, where: str) -> dict[str, Any]:
    """Parse and check a manifest: it must be ours, of a version we read, and well formed (and no
    larger than ``MANIFEST_LIMIT``: checked before parsing)."""
    if len(raw) > MANIFEST_LIMIT:
        raise PackFormatError(f"{where}: manifest of {len(raw):,} bytes, more than the {MANIFEST_LIMIT:,} a "
                              "packload manifest may take; the pack is damaged or not a packload pack")
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, integers too long
        raise PackFormatError(f"{where}: manifest is not valid JSON ({type(exc).__name__}); "
                              "the pack is damaged") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise PackFormatError(f"{where}: not a packload manifest (format is "
                              f"{manifest.get('format') if isinstance(manifest, dict) else type(manifest).__name__!r})")
    if type(manifest.get("version")) is not int or manifest["version"] != FORMAT_VERSION:
        raise PackFormatError(f"{where}: pack format version {manifest.get('version')!r}; this packload "
                              f"reads version {FORMAT_VERSION}: upgrade packload or re-pack the images")
    missing = [key for key in MANIFEST_REQUIRED if key not in manifest]
    if missing:
        raise PackFormatError(f"{where}: manifest lacks {', '.join(missing)}; the pack is damaged")
    if manifest["backend"] not in BACKENDS or manifest["encoding"] not in ENCODINGS:
        raise PackFormatError(f"{where}: unknown backend or encoding in manifest "
                              f"({manifest['backend']!r}, {manifest['encoding']!r})")
    if type(manifest["records"]) is not int or manifest["records"] < 0:
        raise PackFormatError(f"{where}: manifest record count {manifest['records']!r} is not valid")
    if not isinstance(manifest["classes"], list) or not all(isinstance(c, str) for c in manifest["classes"]):
        raise PackFormatError(f"{where}: manifest classes must be a list of names")
    if not isinstance(manifest["skipped"], list) or not all(
            isinstance(s, dict) and isinstance(s.get("path"), str) for s in manifest["skipped"]):
        raise PackFormatError(f"{where}: manifest skipped must be a list of {{path, reason}} entries")
    _check_optional_fields(manifest, where)
    if len(manifest["skipped"]) > skipped_count(manifest) or len(manifest.get("ignored", [])) > ignored_count(manifest):
        raise PackFormatError(f"{where}: manifest lists more skipped or left-out files than it counts; "
                              "the pack is damaged")
    return manifest


def _is_int(value: Any) -> bool:
    return type(value) is int and value >= 0


# Optional manifest fields that readers use, and what each must be when present (a hostile or
# damaged manifest must give PackFormatError, not a TypeError deep inside ``info`` or ``verify``).
_OPTIONAL_FIELDS: dict[str, tuple[str, Any]] = {
    "class_counts": ("an object of counts", lambda v: isinstance(v, dict) and all(map(_is_int, v.values()))),
    "payload_bytes": ("a byte count", lambda v: v is None or _is_int(v)),
    "labelled": ("true or false", lambda v: isinstance(v, bool)),
    "ignored": ("a list of {path, reason} entries", lambda v: isinstance(v, list) and all(
        isinstance(s, dict) and isinstance(s.get("path"), str) for s in v)),
    "source": ("an object with a name, and counts of files and bytes", lambda v: isinstance(v, dict)
               and isinstance(v.get("name", ""), str) and _is_int(v.get("files", 0)) and _is_int(v.get("bytes", 0))),
    "options": ("an object", lambda v: isinstance(v, dict)),
    "index": ("an object with name, size and sha256", lambda v: isinstance(v, dict)
              and v.get("name") in (INDEX_NAME, LMDB_INDEX_KEY.decode()) and isinstance(v.get("sha256"), str)
              and _is_int(v.get("size"))),
    "created": ("a date string", lambda v: isinstance(v, str)),
    "packload_version": ("a version string", lambda v: isinstance(v, str)),
    "id": ("32 hexadecimal digits", lambda v: isinstance(v, str) and len(v) == 32
           and all(c in "0123456789abcdef" for c in v)),
    "skipped_count": ("a count", _is_int),
    "ignored_count": ("a count", _is_int),
    "ignored_by_reason": ("an object of counts", lambda v: isinstance(v, dict) and all(map(_is_int, v.values()))),
}


def _check_optional_fields(manifest: dict[str, Any], where: str) -> None:
    for key, (expected, ok) in _OPTIONAL_FIELDS.items():
        if key in manifest and not ok(manifest[key]):
            raise PackFormatError(f"{where}: manifest {key} must be {expected}; the pack is damaged")
    if "parts" not in manifest:
        return
    parts = manifest["parts"]
    if manifest["backend"] == "shards":
        good = isinstance(parts, list) and all(
            isinstance(p, dict) and isinstance(p.get("name"), str) and _is_int(p.get("size", 0))
            and isinstance(p.get("sha256", ""), str) for p in parts)
        expected = "a list of {name, size, sha256} shards"
    else:
        good = isinstance(parts, dict) and _is_int(parts.get("chunks")) and _is_int(parts.get("chunk_size"))
        expected = "an object with chunks and chunk_size"
    if not good:
        raise PackFormatError(f"{where}: manifest parts must be {expected}; the pack is damaged")


def skipped_count(manifest: dict[str, Any]) -> int:
    """How many source files were skipped as broken (the manifest lists at most ``SKIPPED_LISTED``)."""
    return int(manifest.get("skipped_count", len(manifest["skipped"])))


def ignored_count(manifest: dict[str, Any]) -> int:
    """How many files were left out as not images (the manifest lists at most ``IGNORED_LISTED``)."""
    return int(manifest.get("ignored_count", len(manifest.get("ignored", []))))


def build_manifest(*, backend: str, encoding: str, source: dict[str, Any], labelled: bool, classes: list[str],
                   labels: np.ndarray, payload_bytes: int, skipped: Sequence[dict[str, Any]],
                   ignored: Sequence[dict[str, Any]], options: dict[str, Any],
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of a new pack (before its writer adds ``parts`` and ``index``), built the same
    way by every writer: ``pack``, ``merge`` and the Ray engine.

    ``labels`` are the records' class indices; ``skipped`` and ``ignored`` are ``{path, reason}``
    entries (other keys are dropped). Long lists are cut to ``SKIPPED_LISTED`` / ``IGNORED_LISTED``
    entries with their full counts beside them (left-out files also counted by reason), so that the
    manifest stays small enough for every reader to parse. ``id`` is new for every pack written: a
    reader that reopens a path notices when it holds another pack than the one it opened."""
    ignored = list(ignored)
    by_reason: dict[str, int] = {}
    for item in ignored:
        by_reason[str(item.get("reason", ""))] = by_reason.get(str(item.get("reason", "")), 0) + 1
    manifest: dict[str, Any] = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "id": uuid.uuid4().hex,
        "backend": backend,
        "encoding": encoding,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "packload_version": __version__,
        "source": source,
        "labelled": labelled,
        "classes": list(classes),
        "class_counts": {name: int(n) for name, n in
                         zip(classes, np.bincount(labels[labels >= 0], minlength=len(classes)).tolist(), strict=True)},
        "records": int(len(labels)),
        "payload_bytes": int(payload_bytes),
        "skipped": [{"path": s["path"], "reason": s["reason"]} for s in skipped[:SKIPPED_LISTED]],
        "skipped_count": len(skipped),
        "ignored": [{"path": i["path"], "reason": i["reason"]} for i in ignored[:IGNORED_LISTED]],
        "ignored_count": len(ignored),
        "ignored_by_reason": dict(sorted(by_reason.items())),
        "options": options,
    }
    manifest.update(extra or {})
    return manifest
