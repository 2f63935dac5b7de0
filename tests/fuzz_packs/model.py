"""The pack format as docs/FORMAT.md gives it (struct layouts, no import of packload.core.format),
the intact base packs every case starts from, and ``Model``: a pack's bytes in memory, edited field
by field and written back, with the checksums an attacker would recompute."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.reliability.packs import SHARD_SIZE, make_source, small_chunks

BACKENDS = ("lmdb", "shards")
PAYLOADS = ("keep", "raw")  # JPEG and PNG files as they were, and raw pixels of one size
RAW_SIZE = (40, 48)  # (height, width) of the raw images: two per LMDB chunk, their crop through the kernel
PER_CLASS = 4  # images per class in the base packs (3 classes), and one large PNG: several shards

# -- the format, as docs/FORMAT.md gives it (no import of packload.core.format) ------------------------------

INDEX_HEADER = struct.Struct("<4sIQIIQ")
INDEX_ENTRY = struct.Struct("<IiQQQIIIQHBB8s")
RECORD_HEADER = struct.Struct("<4sIQQIiIIHBB8sI")
SHARD_HEADER = struct.Struct("<4sIII")
HEAD = RECORD_HEADER.size
FORMAT_CODES = 9  # 0 raw, 1 JPEG, ... 8 other
ENCODINGS = ("keep", "jpeg", "png", "raw")
_KINDS = {"I": "u32", "i": "i32", "Q": "u64", "H": "u16", "B": "u8"}
SIZES = {"u8": (1, False), "u16": (2, False), "u32": (4, False), "u64": (8, False), "i32": (4, True)}


def _layout(fmt: str, names: str) -> dict[str, tuple[int, str]]:
    """Each field's (offset, kind) in a struct format, kinds as the format document names them."""
    out, offset = {}, 0
    for (count, code), name in zip(re.findall(r"(\d*)([A-Za-z])", fmt[1:]), names.split(), strict=True):
        out[name] = (offset, f"char{count}" if code == "s" else _KINDS[code])
        offset += struct.calcsize("<" + count + code)
    return out


INDEX_HEADER_FIELDS = _layout(INDEX_HEADER.format, "magic version count entry_size reserved paths_len")
ENTRY_FIELDS = _layout(INDEX_ENTRY.format, "part label payload_offset payload_len record_offset "
                       "payload_crc32 width height path_offset path_len format orientation mode")
RECORD_FIELDS = _layout(RECORD_HEADER.format, "magic header_crc32 record payload_len payload_crc32 label "
                        "width height path_len format orientation mode reserved")
SHARD_FIELDS = _layout(SHARD_HEADER.format, "magic version part reserved")


def put_field(buf: bytearray, at: int, kind: str, value: int | bytes) -> None:
    if kind.startswith("char"):
        size = int(kind[4:])
        buf[at : at + size] = bytes(value).ljust(size, b"\0")[:size]
    else:
        size, signed = SIZES[kind]
        buf[at : at + size] = int(value).to_bytes(size, "little", signed=signed)


def chunk_key(part: int) -> bytes:
    return b"c" + part.to_bytes(8, "big")


def manifest_bytes(manifest: Any) -> bytes:
    """JSON as the packer writes it (sorted keys, one-space indent, trailing newline)."""
    return (json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


# -- base packs and the in-memory model an attacker edits ----------------------------------------------


def make_bases(root: Path) -> dict[tuple[str, str], Path]:
    """The intact packs every case starts from: (backend, payload) → path. Each holds 13 records of 3
    classes in several parts (64 KiB shards, 16 KiB LMDB chunks); ``keep`` holds JPEGs and PNGs of a
    few sizes (one large PNG), ``raw`` pixels of one size."""
    from packload import pack
    from packload.packer.encode import EncodeOptions

    source = make_source(root / "src", per_class=PER_CLASS, big=1)
    out = {}
    with small_chunks():
        for payload in PAYLOADS:
            options = EncodeOptions(encoding="raw", size=RAW_SIZE) if payload == "raw" else None
            for backend in BACKENDS:
                dst = root / f"base-{payload}.{backend}"
                pack(source, dst, backend=backend, options=options, workers=1, progress=False,
                     shard_size=SHARD_SIZE)
                out[(backend, payload)] = dst
    return out


def read_lmdb(pack: Path) -> dict[bytes, bytes]:
    """Every key and value of an LMDB file."""
    import lmdb

    env = lmdb.open(str(pack), subdir=False, readonly=True, lock=False, max_readers=1)
    try:
        with env.begin() as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor()}
    finally:
        env.close()


@dataclass
class Model:
    """A pack's bytes held in memory to be edited: manifest (JSON data, or raw bytes for cases that
    are not JSON), index, and parts (shard files with their header, or LMDB chunk values)."""

    backend: str
    manifest: Any
    index: bytearray
    parts: list[bytearray]
    names: list[str]  # the shard files' names on disk, in part order (shards)

    @classmethod
    def load(cls, pack: Path) -> Model:
        if pack.is_dir():
            manifest = json.loads((pack / "manifest.json").read_bytes())
            names = [part["name"] for part in manifest["parts"]]
            parts = [bytearray((pack / name).read_bytes()) for name in names]
            return cls("shards", manifest, bytearray((pack / "index.bin").read_bytes()), parts, names)
        values = read_lmdb(pack)
        chunks = [bytearray(values[chunk_key(p)]) for p in range(len(values)) if chunk_key(p) in values]
        return cls("lmdb", json.loads(values[b"#manifest"]), bytearray(values[b"#index"]), chunks, [])

    def copy(self) -> Model:
        return Model(self.backend, copy.deepcopy(self.manifest), bytearray(self.index),
                     [bytearray(p) for p in self.parts], list(self.names))

    def write(self, dst: Path) -> Path:
        raw = self.manifest if isinstance(self.manifest, bytes) else manifest_bytes(self.manifest)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if self.backend == "shards":
            dst.mkdir(parents=True)
            for name, data in zip(self.names, self.parts, strict=True):
                (dst / name).write_bytes(data)
            (dst / "index.bin").write_bytes(self.index)
            (dst / "manifest.json").write_bytes(raw)
            return dst
        import lmdb

        values = {b"#manifest": raw, b"#index": bytes(self.index)}
        values.update({chunk_key(p): bytes(data) for p, data in enumerate(self.parts)})
        size = sum(len(v) for v in values.values())
        env = lmdb.open(str(dst), subdir=False, map_size=2 * size + (16 << 20), lock=False, sync=False,
                        metasync=False)
        try:
            with env.begin(write=True) as txn:
                for key, value in values.items():
                    txn.put(key, value)
        finally:
            env.close()
        return dst

    def digest(self) -> str:
        raw = self.manifest if isinstance(self.manifest, bytes) else manifest_bytes(self.manifest)
        h = hashlib.sha256(raw)
        for blob in (self.index, *self.parts):
            h.update(len(blob).to_bytes(8, "little") + blob)
        return h.hexdigest()

    # -- fields --------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        return int.from_bytes(self.index[8:16], "little")

    def entry(self, i: int) -> dict[str, Any]:
        at = INDEX_HEADER.size + INDEX_ENTRY.size * i
        return dict(zip(ENTRY_FIELDS, INDEX_ENTRY.unpack_from(self.index, at), strict=True))

    def set_entry(self, i: int, **values: Any) -> None:
        at = INDEX_HEADER.size + INDEX_ENTRY.size * i
        for name, value in values.items():
            offset, kind = ENTRY_FIELDS[name]
            put_field(self.index, at + offset, kind, value)

    def set_index_header(self, **values: Any) -> None:
        for name, value in values.items():
            offset, kind = INDEX_HEADER_FIELDS[name]
            put_field(self.index, offset, kind, value)

    def paths_at(self) -> int:
        """Where the paths blob starts (for the count the index had when loaded)."""
        return INDEX_HEADER.size + INDEX_ENTRY.size * self.count

    def path(self, i: int) -> bytes:
        e = self.entry(i)
        start = self.paths_at() + e["path_offset"]
        return bytes(self.index[start : start + e["path_len"]])

    def set_record(self, i: int, **values: Any) -> None:
        """Set fields of record ``i``'s header, found where its (intact) index entry says."""
        e = self.entry(i)
        for name, value in values.items():
            offset, kind = RECORD_FIELDS[name]
            put_field(self.parts[e["part"]], e["record_offset"] + offset, kind, value)

    def fix_header_crc(self, i: int) -> None:
        """Recompute record ``i``'s header CRC over its header and the path its header's path_len says."""
        e = self.entry(i)
        part, at = self.parts[e["part"]], e["record_offset"]
        path_len = int.from_bytes(part[at + 40 : at + 42], "little")
        crc = zlib.crc32(part[at + HEAD : at + HEAD + path_len], zlib.crc32(part[at + 8 : at + HEAD]))
        part[at + 4 : at + 8] = crc.to_bytes(4, "little")

    def fix_entry_crc(self, i: int) -> None:
        """Make entry ``i``'s payload_crc32 that of the bytes it now names (when they exist)."""
        e = self.entry(i)
        start, end = e["payload_offset"], e["payload_offset"] + e["payload_len"]
        if e["part"] < len(self.parts) and end <= len(self.parts[e["part"]]):
            span = self.parts[e["part"]][start:end]
            self.set_entry(i, payload_crc32=zlib.crc32(span))

    def seal(self) -> None:
        """Recompute the manifest's index sha256 and size, and each shard's sha256 and size."""
        manifest = self.manifest
        if not isinstance(manifest, dict):
            return
        index = manifest.get("index")
        if isinstance(index, dict):
            index.update(sha256=hashlib.sha256(self.index).hexdigest(), size=len(self.index))
        parts = manifest.get("parts")
        if self.backend == "shards" and isinstance(parts, list):
            files = dict(zip(self.names, self.parts, strict=True))
            for part in parts:
                if isinstance(part, dict) and isinstance(part.get("name"), str) and part["name"] in files:
                    data = files[part["name"]]
                    part.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
